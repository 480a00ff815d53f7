"""The GIL time a server spends on long request bodies, with and without parser processes.

    python benchmarks/bench_body_parse.py --tokens 125000 --bodies 64 --out results/body_parse/cpu.json

With the engine as a thread of the server process (``server.engine_process=false``), the GIL the
server's event loop holds is time the engine thread cannot queue a step or a handoff. Here a probe thread stands in for the engine
thread: it runs short pieces of Python work back to back, as long as the run lasts, while the
event loop parses ``--bodies`` ``/generate`` bodies of ``--tokens`` ids (``--concurrency`` at a
time) through the server's ``BodyParser`` with each ``--workers`` count (0: on the event loop,
as before parser processes; the counts interleaved, ``--repeats`` times). Per body it reports the
event loop thread's CPU time, and the probe's lost time: the wall time of the run less the time
its pieces would have taken alone, over the bodies; and the probe's longest wait for one piece
(the longest the GIL was out of its reach). The prompt key (``PromptKey``) each body's ids get
on the server's thread is part of the loop's work, as in ``Engine.submit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from systems.engine.body_parser import BodyParser, TokenIds  # noqa: E402
from systems.engine.prefill import PromptKey  # noqa: E402


class Probe(threading.Thread):
    """Back-to-back pieces of pure-Python work (no GIL release of their own): how much of the
    wall time the other thread leaves to it."""

    def __init__(self, piece: int):
        super().__init__(daemon=True)
        self.piece = piece
        self.stop = threading.Event()
        self.pieces = 0
        self.longest = 0.0

    @staticmethod
    def work(n: int) -> int:
        s = 0
        for i in range(n):
            s += i
        return s

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            self.work(self.piece)
            self.longest = max(self.longest, time.perf_counter() - t)
            self.pieces += 1


def piece_seconds(piece: int, n: int = 400) -> float:
    """The median time of one probe piece with nothing else running."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        Probe.work(piece)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


async def parse_all(parser: BodyParser, raw: bytes, bodies: int, concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one():
        async with sem:
            body = await parser.parse(raw)
            ids = body["input_ids"]
            PromptKey(ids.to_array() if isinstance(ids, TokenIds) else ids)

    await asyncio.gather(*(one() for _ in range(bodies)))


async def measure(workers: int, raw: bytes, args, alone: float) -> dict:
    parser = BodyParser(workers)
    if workers:
        await parser.start()
        await parse_all(parser, raw, workers, workers)  # each process past its first body
    probe = Probe(args.piece)
    probe.start()
    await asyncio.sleep(0.05)  # the probe running before the first body
    c0, p0, t0 = time.thread_time(), probe.pieces, time.perf_counter()
    probe.longest = 0.0
    await parse_all(parser, raw, args.bodies, args.concurrency)
    wall = time.perf_counter() - t0
    cpu, pieces, longest = time.thread_time() - c0, probe.pieces - p0, probe.longest
    probe.stop.set()
    probe.join()
    await parser.close()
    lost = max(0.0, wall - pieces * alone)
    return {
        "workers": workers,
        "wall_ms_per_body": 1e3 * wall / args.bodies,
        "loop_cpu_ms_per_body": 1e3 * cpu / args.bodies,
        "probe_lost_ms_per_body": 1e3 * lost / args.bodies,
        "probe_share": pieces * alone / wall,
        "probe_longest_wait_ms": 1e3 * longest,
        "parsed": dict(parser.parsed),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=125_000, help="ids per body")
    ap.add_argument("--bodies", type=int, default=64, help="bodies per measurement")
    ap.add_argument("--concurrency", type=int, default=8, help="bodies in flight at once")
    ap.add_argument("--workers", default="0,2", help="parser process counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--piece", type=int, default=2000, help="the probe's piece of work (loop n)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    if args.tokens < 1 or args.bodies < 1 or args.concurrency < 1 or args.repeats < 1:
        ap.error("--tokens, --bodies, --concurrency and --repeats must be >= 1")
    rng = random.Random(0)
    ids = [rng.randrange(100_000) for _ in range(args.tokens)]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 512}, "stream": True}
    raw = json.dumps(body).encode()
    if len(raw) < BodyParser(0).min_bytes:
        ap.error(
            f"--tokens {args.tokens} makes {len(raw)}-byte bodies, which the server parses "
            f"in-process whatever --workers says (below {BodyParser(0).min_bytes} bytes)"
        )
    alone = piece_seconds(args.piece)
    print(
        f"# {len(raw) / 1e6:.2f} MB bodies ({args.tokens} ids), {args.bodies} per measurement, "
        f"{args.concurrency} at a time; probe piece {alone * 1e6:.0f} us alone"
    )
    print(
        f"{'workers':>7} {'loop CPU ms':>11} {'probe lost ms':>13} {'probe share':>11} "
        f"{'longest wait ms':>15} {'wall ms':>8}   (per body)"
    )
    rows = []
    for rep in range(args.repeats):
        for w in counts if rep % 2 == 0 else counts[::-1]:  # alternate which count goes first
            r = asyncio.run(measure(w, raw, args, alone))
            r["repeat"] = rep
            rows.append(r)
            print(
                f"{w:>7} {r['loop_cpu_ms_per_body']:>11.2f} {r['probe_lost_ms_per_body']:>13.2f} "
                f"{r['probe_share']:>11.2f} {r['probe_longest_wait_ms']:>15.2f} "
                f"{r['wall_ms_per_body']:>8.2f}"
            )
    summary = {}
    for w in counts:
        mine = [r for r in rows if r["workers"] == w]
        summary[str(w)] = {
            k: statistics.median(r[k] for r in mine)
            for k in (
                "loop_cpu_ms_per_body",
                "probe_lost_ms_per_body",
                "probe_share",
                "probe_longest_wait_ms",
                "wall_ms_per_body",
            )
        }
    print("medians:", json.dumps(summary, indent=1))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
        except OSError:
            commit = ""
        with open(args.out, "w") as f:
            json.dump(
                {
                    "benchmark": "bench_body_parse",
                    "args": vars(args),
                    "commit": os.environ.get("DHS_GIT_COMMIT") or commit,
                    "machine": {
                        "host": platform.node(),
                        "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                        "processor": platform.processor() or platform.machine(),
                    },
                    "probe_piece_us": alone * 1e6,
                    "rows": rows,
                    "medians": summary,
                },
                f,
                indent=1,
            )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
