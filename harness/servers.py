"""Start, attach to, and stop the server a run measures.

- ``subprocess``: the bundled server in its own process (the default: the load generator never
  shares a process or a GIL with the engine), config passed as a resolved YAML file, logs to
  ``server-<start time>-<pid>.log`` (``server_log``).
- ``inprocess``: engine thread + aiohttp app on a background thread of this process (tests).
- ``attach``: an already running endpoint at ``server.url`` (our server or SGLang).

Every mode waits for ``GET /health`` before the load starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from systems.pids import remove_files_of_dead_pids

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5) as r:
            return r.status == 200, f"HTTP {r.status}"
    except Exception as e:  # not up yet
        return False, repr(e)


def wait_healthy(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen | None = None,
    log_path: Path | None = None,
    what: str = "server",
) -> None:
    """Poll ``url/health`` until 200; fail early when ``proc`` exits, with its log tail."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = (
                log_path.read_text(errors="replace")[-4000:]
                if log_path and log_path.exists()
                else ""
            )
            raise RuntimeError(
                f"{what} exited with code {proc.returncode} before "
                f"{url}/health answered; log {log_path}:\n{tail}"
            )
        ok, last = _health(url)
        if ok:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} at {url} not healthy after {timeout_s:.0f} s ({last})")


# Server processes this harness started and has not stopped yet: (process, signal its group).
_LIVE: dict[int, tuple[subprocess.Popen, bool]] = {}
# What a SIGTERM must still do before the harness exits (exit_on_sigterm), e.g. put back a run
# that a re-measurement moved aside: the handler ends the process without unwinding.
_ON_SIGTERM: dict[object, Callable[[], None]] = {}


@contextlib.contextmanager
def on_sigterm(fn: Callable[[], None]):
    """Within the block, a SIGTERM that ends the harness (exit_on_sigterm) calls ``fn`` first."""
    key = object()
    _ON_SIGTERM[key] = fn
    try:
        yield
    finally:
        _ON_SIGTERM.pop(key, None)


def track(proc: subprocess.Popen, group: bool = False) -> None:
    """Register a started server so that a SIGTERM to the harness stops it (exit_on_sigterm)."""
    _LIVE[proc.pid] = (proc, group)


def exit_on_sigterm() -> None:
    """On SIGTERM, stop every server this harness started, then exit with 143. A time box
    (``timeout 300 python -m harness.reproduce``) ends a sweep with SIGTERM; Python's default
    action left a bundled server decoding on the GPU with its pools and pinned host store,
    beside whatever the lane ran next. The servers are stopped here, not by raising into the
    interrupted code: an exception raised inside an event-loop callback (the load generator's
    socket reads) is logged by the loop and swallowed, and the harness went on."""

    def _exit(signum, frame):
        try:
            for proc, group in reversed(list(_LIVE.values())):  # last started first (router)
                try:
                    stop_process(proc, grace_s=10.0, group=group)
                except Exception:
                    pass
            for fn in list(_ON_SIGTERM.values()):
                try:
                    fn()
                except Exception:
                    pass
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(
                128 + signum
            )  # results are written atomically: an unfinished run has no summary

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0, group: bool = False) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; ``group`` signals the process group the child
    leads (start_new_session=True), for servers with child processes (SGLang's schedulers, the
    bundled server's engine process). A group is signalled whatever its leader's state: a
    leader that crashed at start-up can leave its children holding the GPU."""
    try:
        if proc.poll() is not None and not group:
            return
        _stop(proc, grace_s, group)
    finally:
        _LIVE.pop(proc.pid, None)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: still there
        return True
    return True


def _stop(proc: subprocess.Popen, grace_s: float, group: bool) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            return
        if not group:
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
        # a group: until every member has gone, not only its leader
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, so that it no longer counts as a member
            if not _group_alive(proc.pid):
                return
            time.sleep(0.05)


_STARTED = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"


def server_log(workdir: Path) -> Path:
    """The log of the bundled servers this harness process starts from ``workdir``: a file of
    this process (ignored by git), never one an earlier run wrote and a commit may hold."""
    return Path(workdir) / f"server-{_STARTED}.log"


def server_profile_dir(workdir: Path) -> Path:
    """Where the collectors of a bundled server write until the harness moves their outputs into
    the run directory: one folder per harness process, because two harnesses (two lanes of one
    machine) can serve the same experiment, system and model at once from one server folder, and
    one collector's files must never be read back mid-write by the other's."""
    return Path(workdir) / f"profile-{os.getpid()}"


def remove_stale_launch_configs(workdir: Path) -> list[Path]:
    """Delete ``server_config-<pid>.yaml`` files whose harness process is gone (killed before
    its ``finally`` ran); a live harness's file (the other lane's) stays."""
    return remove_files_of_dead_pids(
        Path(workdir).glob("server_config-*.yaml"),
        lambda f: f.stem.removeprefix("server_config-"),
    )


@contextlib.contextmanager
def bundled_server(cfg: DictConfig, workdir: Path):
    """Yields the base URL of a server for ``cfg`` according to ``cfg.server.mode`` (SGLang
    deployments: harness.sglang_launch.sglang_server)."""
    mode = cfg.server.mode
    host = cfg.server.host
    timeout = float(cfg.server.startup_timeout_s)
    if mode == "attach":
        if not cfg.server.url:
            raise ValueError("server.url is required with server.mode=attach")
        url = str(cfg.server.url).rstrip("/")
        wait_healthy(url, timeout)
        yield url
        return
    port = int(cfg.server.port) or free_port()
    url = f"http://{host}:{port}"
    if mode == "inprocess":
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.profile_dir = str(server_profile_dir(workdir))
        with _inprocess(cfg, host, port):
            wait_healthy(url, timeout)
            yield url
        return
    if mode != "subprocess":
        raise ValueError(
            f"server.mode must be subprocess, inprocess or attach here "
            f"(sglang: harness.sglang_launch), got {mode!r}"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    remove_stale_launch_configs(workdir)
    log_path = server_log(workdir)  # this process's own: earlier (committed) logs stay as they are
    cfg_path = log_path.with_suffix(".yaml")
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.profile_dir = str(server_profile_dir(workdir))  # collectors of the server's engine
    OmegaConf.save(cfg, cfg_path, resolve=True)  # the record of this server, beside its log
    # the file this server reads: its own, because another harness (the other lane of a 2-GPU
    # machine) may start a server of the same experiment, system and model from this folder and
    # rewrite a shared config before this server has read it
    launch_cfg = workdir / f"server_config-{os.getpid()}.yaml"
    OmegaConf.save(cfg, launch_cfg, resolve=True)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            # --parent-pid: the server dies with this process, even when it is SIGKILLed and
            # nothing here runs (exit_on_sigterm covers SIGTERM only)
            [
                sys.executable,
                "-m",
                "systems.engine.server",
                "--host",
                host,
                "--port",
                str(port),
                "--config",
                str(launch_cfg),
                "--parent-pid",
                str(os.getpid()),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO),
            # its own process group, signalled whole: the engine runs in a child process of the
            # server (server.engine_process) and holds the GPU until it exits, so a server
            # killed after the grace period must not leave it behind for the next run's server
            start_new_session=True,
        )
    track(proc, group=True)
    try:
        wait_healthy(url, timeout, proc, log_path, "bundled server")
        # paid once per system and setting: the engine's own phases are in its log
        print(f"[harness] server up in {time.monotonic() - t0:.1f} s ({log_path})", flush=True)
        yield url
    finally:
        stop_process(proc, group=True)
        launch_cfg.unlink(missing_ok=True)


@contextlib.contextmanager
def _inprocess(cfg: DictConfig, host: str, port: int):
    from systems.engine.config import resolve_engine_config
    from systems.engine.engine import Engine
    from systems.engine.server import ServerConfig, build_app, start_server

    engine = Engine(resolve_engine_config(cfg))
    engine.start()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state = {}

    async def serve():
        app = build_app(engine, config=ServerConfig.from_cfg(cfg.get("server"), host=host))
        state["serving"] = await start_server(app, port)
        started.set()

    def target():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve())
        loop.run_forever()

    t = threading.Thread(target=target, name="inprocess-server", daemon=True)
    t.start()
    started.wait(60)
    try:
        yield engine
    finally:
        fut = asyncio.run_coroutine_threadsafe(state["serving"].close(), loop)
        fut.result(30)
        loop.call_soon_threadsafe(loop.stop)
        t.join(30)
        engine.stop()
