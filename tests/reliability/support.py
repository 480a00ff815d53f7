"""Shared pieces of the reliability tests: servers over real loopback sockets, SSE reading (from
tests.helpers), and the "nothing left behind" check every scenario ends with."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import aiohttp

from systems.engine.engine import Engine
from systems.engine.server import ServerConfig, build_app, start_server
from systems.kv.base import PagePool
from tests.helpers import golden_prompts, make_engine, read_sse  # noqa: F401 (re-exported)

PROMPTS = golden_prompts()  # lengths 5, 23, 40, 77, 130

# The speculative system of the storm/fault tests, sized for the CPU pools: a short drafter window
# keeps the draft ring (a fixed allocation taken out of the KV pool) small.
SPEC = (
    "system=adaptive_dhisparse",
    "system.kv.hot_cache_rows=16",
    "system.speculation.window=64",
    "hardware.kv_pool_gib=0.01",
)

SYSTEMS = {
    "resident": ("system=resident",),
    "hisparse": ("system=hisparse",),
    "adaptive_hisparse": ("system=adaptive_hisparse",),
    "adaptive_dhisparse": SPEC,
}


def engine_idle(eng: Engine) -> bool:
    return eng.is_idle


def wait_idle_sync(eng: Engine, timeout: float = 60.0) -> None:
    eng.wait_idle(timeout)


async def wait_idle(eng: Engine, timeout: float = 60.0) -> None:
    await eng.wait_idle_async(timeout)


def page_pools(backend) -> dict[str, PagePool]:
    return {name: v for name, v in vars(backend).items() if isinstance(v, PagePool)}


def assert_drained(eng: Engine) -> None:
    """Everything a request can hold is back: slots, every page pool (index, payload, host),
    optional history and its direct table, the host page tables, the in-flight step (staging
    arenas and draft-ring rows are per-slot / per-step, so free slots and no open step mean they
    hold nothing live), and the engine's own request bookkeeping."""
    be = eng.backend
    be.check_integrity()
    assert be.is_empty, f"slots still allocated: {sorted(be.active_slots)}"
    assert sorted(be.free_slots) == list(range(be.num_slots))
    assert be._step is None, "a decode step was left open"
    for name, pool in page_pools(be).items():
        assert pool.num_used == 0, f"{name} pool: {pool.num_used} pages still used"
        pool.check()
    if hasattr(be, "_slot_pages"):  # HiSparse family: hot/tail pages and host pages per slot
        assert not be._slot_pages
        n = be.num_slots  # the padding slot's row past them keeps its own page (KVBackend)
        assert bool((be.slot_page[:n] == -1).all()) and bool((be.host_page_table == -1).all())
        assert int(be.slot_page[be.pad_slot]) == be.pad_page
    if hasattr(be, "res"):  # adaptive: optional history
        assert not be.res and be.optional_pages == 0
        assert bool((be.direct_table == -1).all())
    assert not eng.scheduler.running and not eng.scheduler.waiting
    assert not eng.requests and not eng._live, "request bookkeeping leaked"


@contextlib.asynccontextmanager
async def served(*overrides: str, engine: Engine | None = None, config: ServerConfig | None = None):
    """An engine on its own thread behind the real app, served as ``python -m
    systems.engine.server`` serves it (timeouts, connection cap, disconnect handling), on a
    loopback port of this loop. Yields (session, engine, base_url). The session has no
    connection limit."""
    eng = engine or make_engine(*overrides)
    eng.start()
    srv = await start_server(build_app(eng, config=config))
    base = f"http://127.0.0.1:{srv.port}"
    conn = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(base_url=base, connector=conn) as s:
            yield s, eng, base
    finally:
        await srv.close()
        eng.stop()


class ThreadedServer:
    """The app on a background event loop (for synchronous clients: http.client, subprocesses)."""

    def __init__(self, eng: Engine, config: ServerConfig | None = None):
        self.engine = eng
        self.config = config
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reliability-server", daemon=True)
        self.port = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start():
            self.serving = await start_server(build_app(self.engine, config=self.config))
            self.port = self.serving.port
            self._ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def __enter__(self) -> ThreadedServer:
        self.engine.start()
        self._thread.start()
        assert self._ready.wait(30), "server did not start"
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.serving.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.engine.stop()
