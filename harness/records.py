"""Per-request record type and crash-safe writers.

A :class:`RequestRecord` holds everything the metric functions in
:mod:`harness.metrics` need about one request.  Times named ``*_mono`` come
from :func:`time.perf_counter` (a monotonic clock; only differences are
meaningful), times named ``*_epoch`` / ``*_ts`` are wall-clock seconds since
the epoch.

Writers:

* :class:`JsonlWriter` appends one JSON object per line and flushes after every
  line, so a crash or a cancelled run keeps every record written so far.
* :func:`atomic_write_json` writes a JSON document to a temporary file in the
  destination directory and renames it over the target with
  :func:`os.replace`, so readers never see a half-written file.
"""

from __future__ import annotations

import gzip
import json
import lzma
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RequestRecord",
    "JsonlWriter",
    "atomic_write_json",
    "read_jsonl",
    "load_records",
]


@dataclass
class RequestRecord:
    """One measured request.

    ``chunks`` is a list of ``[arrival_mono, n_tokens]`` pairs, one per
    streamed SSE data event (``[DONE]`` excluded).  Chunks carrying zero new
    tokens are kept (they count for E2E but not for TTFT/ITL).
    """

    rid: str
    index: int  # submission order among measured requests (0-based)
    phase: int = 0  # schedule phase at send time (0 when there is no schedule)
    concurrency: int | None = None  # target concurrency at send time (None: open loop)
    send_mono: float = 0.0
    send_epoch: float = 0.0
    chunks: list = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # as reported by the server
    timing: dict | None = None  # server timing dict from the final chunk
    status: int | None = None  # HTTP status (None: no response, e.g. connect error)
    error: str | None = None
    success: bool = False
    done_mono: float | None = None  # when the response was fully read / failed
    retry_after: float | None = None  # Retry-After header of an error response
    finish_reason: Any = None

    def to_dict(self) -> dict:
        # Shallow on purpose: dataclasses.asdict deep-copies the chunk list,
        # which costs ~1 us per chunk.
        return {name: getattr(self, name) for name in _FIELDS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict) -> RequestRecord:
        known = {f for f in cls.__dataclass_fields__}  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in d.items() if k in known})


_FIELDS = tuple(RequestRecord.__dataclass_fields__)  # type: ignore[attr-defined]


class JsonlWriter:
    """Append-only JSON-lines writer that flushes after every record.

    ``fsync=True`` additionally calls :func:`os.fsync` per record (survives a
    machine crash, not only a process crash; slower).
    """

    def __init__(self, path: str | os.PathLike, *, mode: str = "w", fsync: bool = False):
        self.path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(d, exist_ok=True)
        self._f = open(self.path, mode, encoding="utf-8")
        self._fsync = fsync
        self.count = 0

    def write(self, obj: Any) -> None:
        if isinstance(obj, RequestRecord):
            line = obj.to_json()
        elif isinstance(obj, str):
            line = obj
        else:
            line = json.dumps(obj, separators=(",", ":"))
        self._f.write(line + "\n")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())
        self.count += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _json_default(o: Any) -> Any:
    # numpy scalars / arrays without importing numpy here
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _sanitize(o: Any) -> Any:
    """Replace NaN/inf floats by None so the output is strict JSON."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _sanitize(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_sanitize(v) for v in o]
    return o


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temp file + os.replace).

    Non-finite floats are written as ``null``.
    """
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_sanitize(obj), f, indent=indent, default=_json_default, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(d)  # the rename itself survives a machine crash too
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


COMPRESSED_SUFFIXES = (".xz", ".gz")  # what harness.compact writes (now .xz; .gz before)


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Yield objects from a JSON-lines file (xz- or gzip-compressed when it ends in .xz / .gz, or
    when only ``<path>.xz`` / ``<path>.gz`` exists: harness.compact compresses finished runs); a
    truncated last line is skipped."""
    path = Path(path)
    if not path.exists():
        for suf in COMPRESSED_SUFFIXES:
            if path.with_name(path.name + suf).exists():
                path = path.with_name(path.name + suf)
                break
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                # a crash mid-write can leave a partial last line
                continue


def load_records(path: str | os.PathLike) -> list[RequestRecord]:
    return [RequestRecord.from_dict(d) for d in read_jsonl(path)]


def write_records(path: str | os.PathLike, records: Iterable[RequestRecord]) -> None:
    with JsonlWriter(path) as w:
        for r in records:
            w.write(r)


def finish_benchmark(out: str | os.PathLike | None, record: dict, failed: bool) -> None:
    """End of a benchmark script: the record (with this machine's environment: GPU, commit,
    versions) written atomically to ``out`` when given, then exit 1 if a check failed."""
    import sys

    from harness.environment import environment

    if out:
        atomic_write_json(out, {**record, "env": environment()})
    sys.exit(1 if failed else 0)
