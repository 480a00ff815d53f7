"""Request bodies parsed outside the server process's GIL.

A 125,000-token ``input_ids`` body holds the GIL for ~13 ms (``json.loads`` ~7 ms, one C call
the interpreter cannot interrupt, then the ids' checks ~5 ms). With the engine as a thread of the
server process (``server.engine_process=false``, in-process servers) that is a millisecond the
engine thread cannot queue a step or a handoff for every millisecond parsed: under a closed loop
every arrival costs the engine that much, and an arrival wave of 256 such requests seconds; with
the engine in its own process (the CLI's default, as SGLang runs its scheduler apart from the
HTTP front end) it still stalls every stream the event loop writes. The front end hands large
bodies to parser processes (``server.parse_workers``), which return the token-id lists as packed
int64 bytes (``TokenIds``) with their length and range. What is left on the GIL is a memcpy per
list, well under a millisecond.

The workers are plain subprocesses (``python -m systems.engine.body_parser``) that import nothing
but the standard library: a multiprocessing pool would import the server's main module, and
with it torch, into each. They speak length-prefixed frames over their stdin / stdout and exit
when their stdin closes (the server's exit, however it dies). A reply is JSON (the body with its
packed lists left out, and where each goes) followed by the packed bytes: nothing a request
sends is ever unpickled or evaluated. Bodies below ``min_bytes`` are
parsed on the event loop: the round trip costs more than such a parse. A worker that dies fails
its pending bodies over to the event loop and is not replaced (logged once): the server keeps
serving, the GIL time comes back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import sys
from array import array

log = logging.getLogger("dhs.server")

# the fields that carry token ids: /generate's input_ids, /v1/completions' prompt (or a batch of
# one prompt); other fields are small and stay plain values
ID_FIELDS = ("input_ids", "prompt")
# lists shorter than this stay lists: packing them saves nothing
MIN_PACKED_IDS = 256
_ASK = struct.Struct("<QQ")  # request number, body bytes
_REPLY = struct.Struct("<QQQ")  # request number, JSON bytes, packed bytes


class BodyError(ValueError):
    """A body that is not a JSON object of UTF-8 text; the server answers 400 with the message."""


class TokenIds:
    """A list of int token ids, packed: ``data`` holds them as native int64, ``lo`` / ``hi``
    their range (``n`` > 0). ``to_array()`` gives them back as an ``array('q')``, which the
    engine takes wherever it takes a list of ids."""

    __slots__ = ("data", "n", "lo", "hi")

    def __init__(self, data: bytes | memoryview, n: int, lo: int, hi: int):
        self.data, self.n, self.lo, self.hi = data, n, lo, hi

    def __len__(self) -> int:
        return self.n

    def to_array(self) -> array:
        a = array("q")
        a.frombytes(self.data)
        return a


def loads(raw: bytes) -> dict:
    """``raw`` as a JSON object; ``BodyError`` with the reason where it is not one."""
    try:
        # JSON between systems is UTF-8 (RFC 8259): a charset parameter is not honoured, so an
        # unknown or hostile one cannot change how the body is read
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BodyError("body is not UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise BodyError(f"malformed JSON body: {e.msg} at position {e.pos}") from None
    except RecursionError:
        raise BodyError("malformed JSON body: nested too deeply") from None
    except ValueError as e:  # e.g. an integer literal longer than Python converts
        raise BodyError(f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise BodyError("body must be a JSON object")
    return body


def pack(value):
    """A list of ints (bool excluded) of at least MIN_PACKED_IDS that fits int64 as
    ``TokenIds``; anything else unchanged, for the server's checks to judge."""
    if type(value) is not list or len(value) < MIN_PACKED_IDS or set(map(type, value)) != {int}:
        return value
    try:
        data = array("q", value).tobytes()
    except OverflowError:
        return value
    return TokenIds(data, len(value), min(value), max(value))


def _id_places(body: dict):
    """(container, key, field, inner) of each id field's value in ``body``: the value itself,
    or the inner value of a batch of one prompt (``inner``)."""
    for f in ID_FIELDS:
        v = body.get(f)
        if type(v) is list and len(v) == 1 and type(v[0]) in (list, TokenIds):
            yield v, 0, f, True
        elif v is not None:
            yield body, f, f, False


def parse(raw: bytes) -> dict:
    """``loads`` with the id fields packed: a batch of one prompt's inner list too."""
    body = loads(raw)
    for c, k, _, _ in _id_places(body):
        c[k] = pack(c[k])
    return body


# ---------------------------------------------------------------------- the worker process
def _reply(raw: bytes) -> tuple[bytes, bytes]:
    """(JSON, packed bytes) of one body: ``{"ok": body, "packed": [[field, inner, n, lo, hi],
    ...]}`` with each packed list's place in the body set to null (``inner``: the inner list of
    a batch of one prompt) and its bytes, in that order, after the JSON; ``{"bad": message}``;
    ``{"retry": reason}`` where the server should parse the body itself."""
    try:
        body = parse(raw)
        packed, blobs = [], []
        for c, k, f, inner in list(_id_places(body)):
            t = c[k]
            if isinstance(t, TokenIds):
                packed.append([f, inner, t.n, t.lo, t.hi])
                blobs.append(t.data)
                c[k] = None
        return json.dumps({"ok": body, "packed": packed}).encode(), b"".join(blobs)
    except BodyError as e:
        return json.dumps({"bad": str(e)}).encode(), b""
    except Exception as e:  # noqa: BLE001 - e.g. a body whose re-encoding recurses too deep
        return json.dumps({"retry": repr(e)}).encode(), b""


def _worker() -> None:
    import signal

    # a terminal's Ctrl-C reaches the whole process group: the server closes our stdin to stop
    # us, so the signal is its, not ours (no KeyboardInterrupt traceback per worker)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    _widen(inp.fileno())
    _widen(out.fileno())
    while True:
        head = inp.read(_ASK.size)
        if len(head) < _ASK.size:
            return  # the server closed our stdin: it is done (or gone)
        seq, n = _ASK.unpack(head)
        raw = inp.read(n)
        if len(raw) < n:
            return
        meta, blob = _reply(raw)
        out.write(_REPLY.pack(seq, len(meta), len(blob)) + meta + blob)
        out.flush()


def _widen(fd: int) -> None:
    """Linux: a 1 MiB pipe buffer (the default 64 KiB splits a 125K-token body into 14 writes
    and as many event-loop callbacks in the server); elsewhere, or past the system's limit, the
    default stays. Either end of a pipe may set it."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


# ---------------------------------------------------------------------- the server's side
def _unpack(meta: bytes, blob: bytes) -> tuple[str, object]:
    """A worker's reply as (kind, body or message)."""
    reply = json.loads(meta)
    if "ok" not in reply:
        return ("bad", reply["bad"]) if "bad" in reply else ("retry", reply["retry"])
    body, at, view = reply["ok"], 0, memoryview(blob)
    for f, inner, n, lo, hi in reply["packed"]:
        c, k = (body[f], 0) if inner else (body, f)
        c[k] = TokenIds(view[at : at + 8 * n], n, lo, hi)
        at += 8 * n
    return "ok", body


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.pending: dict[int, asyncio.Future] = {}
        self.alive = True
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        out = self.proc.stdout
        try:
            while True:
                seq, m, b = _REPLY.unpack(await out.readexactly(_REPLY.size))
                meta = await out.readexactly(m)
                reply = _unpack(meta, await out.readexactly(b) if b else b"")
                fut = self.pending.pop(seq, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.alive = False
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_result(("retry", "parser process exited"))
            self.pending.clear()


class BodyParser:
    """Parses request bodies for the server: large ones in ``workers`` parser processes, the
    rest, and every body when ``workers`` is 0 or none is alive, on the calling thread (the
    server's event loop). The processes start with the first large body, which is parsed
    in-process meanwhile: a server that never sees one (most tests, short-prompt workloads)
    starts none, and no request waits for a start (~40 ms a process)."""

    def __init__(self, workers: int, min_bytes: int = 64 << 10):
        if not isinstance(workers, int) or isinstance(workers, bool) or not 0 <= workers <= 64:
            raise ValueError(f"server.parse_workers must be an integer in [0, 64], got {workers!r}")
        self.num_workers = workers
        self.min_bytes = min_bytes
        self.workers: list[_Worker] = []
        self._starting: asyncio.Task | None = None
        self._seq = 0
        self._lost_logged = False
        self.parsed = {"worker": 0, "inline": 0}  # bodies (/metrics)

    async def start(self) -> None:
        """Start the processes (once; later calls wait for the first)."""
        await self._begin()

    def _begin(self) -> asyncio.Future:
        """The start of the processes, set off on the first call."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return self._starting

    async def _start(self) -> None:
        env = dict(os.environ)
        # the workers import systems.engine.body_parser from this checkout
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for _ in range(self.num_workers):
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "systems.engine.body_parser",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                )
            except OSError as e:  # out of processes or memory: parse in-process
                log.warning("body parser process not started (%r): bodies parsed in-process", e)
                return
            self.workers.append(_Worker(proc))

    async def close(self) -> None:
        if self._starting is not None:
            await self._starting
        for w in self.workers:
            if w.proc.stdin is not None and not w.proc.stdin.is_closing():
                w.proc.stdin.close()  # EOF: the worker exits
        for w in self.workers:
            try:
                await asyncio.wait_for(w.proc.wait(), 5.0)
            except TimeoutError:
                w.proc.kill()
                await w.proc.wait()
            w.reader.cancel()
        self.workers.clear()

    async def parse(self, raw: bytes) -> dict:
        """The body as a dict (id fields packed where they are long); ``BodyError`` where it is
        not a JSON object."""
        large = len(raw) >= self.min_bytes
        if large and self.num_workers:
            self._begin()
        live = [w for w in self.workers if w.alive]
        if large and live:
            w = min(live, key=lambda w: len(w.pending))
            self._seq += 1
            seq = self._seq
            fut = asyncio.get_running_loop().create_future()
            w.pending[seq] = fut
            try:
                w.proc.stdin.write(_ASK.pack(seq, len(raw)))
                w.proc.stdin.write(raw)
                await w.proc.stdin.drain()
                kind, value = await fut
            except (ConnectionError, RuntimeError) as e:
                w.pending.pop(seq, None)
                kind, value = "retry", repr(e)
            if kind == "ok":
                self.parsed["worker"] += 1
                return value
            if kind == "bad":
                self.parsed["worker"] += 1
                raise BodyError(value)
            if not self._lost_logged and not w.alive:
                self._lost_logged = True
                log.warning("a body parser process exited (%s): bodies parsed in-process", value)
        self.parsed["inline"] += 1
        return parse(raw)


if __name__ == "__main__":
    _worker()
