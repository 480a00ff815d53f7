"""What the engine process's messages cost (systems/engine/engine_process.py, server.engine_process).

Per scheduling round with N running requests that emit K tokens each:

- ``engine_us``: the engine thread's time for N output callbacks and the round's one pickled
  send (``_Outputs``), the work the engine thread does for the server once per round;
- ``server_loop_cpu_us``: the server's event-loop CPU time to read and unpickle the message,
  hand each output to its request's stream queue (``EngineProcessClient._deliver``) and wake N
  tasks that drain those queues as the streams' handlers do (no HTTP writes: those are the same
  whatever process the engine is in);
- ``bytes``: the message's size.

And ``submit_us``: a submission's round trip (pickle, send, unpickle, reply) with a P-token
prompt packed as int64.

    python benchmarks/bench_engine_ipc.py --out results/engine_ipc/cpu.json

The engine's side runs as a thread of this process and speaks the same wire with the same
classes (``_Wire``, ``_Outputs``); the server's side is ``EngineProcessClient``. Medians of
``--rounds`` rounds after ``--warmup``; a round starts when the previous one was drained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import platform
import socket
import statistics
import sys
import threading
import time
import types
from array import array

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from systems.engine.engine_process import EngineProcessClient, _Outputs, _Wire  # noqa: E402
from systems.engine.request import Request, SamplingParams  # noqa: E402


def _engine_side(sock: socket.socket) -> None:
    """Answers submissions; ("rounds", call id, k, rounds, warm-up) emits rounds for every
    request submitted so far, one after the server's ("ack",) of the previous one, and replies
    with the engine thread's seconds per round."""
    wire, live = _Wire(sock), {}
    outputs = _Outputs(wire, live)
    seqs: list[int] = []
    while True:
        msg = wire.recv()
        if msg[0] == "stop":
            return
        if msg[0] == "submit":
            seqs.append(msg[2])
            wire.send(("reply", msg[1], True, None))
            continue
        _, cid, k, rounds, warmup = msg
        callbacks = [outputs.callback(s) for s in seqs]
        req, toks, times = Request("r", [], SamplingParams()), list(range(k)), []
        for _ in range(warmup + rounds):
            t0 = time.perf_counter()
            for cb in callbacks:
                cb(req, toks, False)
            outputs.flush()
            times.append(time.perf_counter() - t0)
            assert wire.recv() == ("ack",)
        size = len(pickle.dumps(("out", [(s, list(toks), False, None) for s in seqs]), protocol=5))
        wire.send(("reply", cid, True, {"seconds": times[warmup:], "bytes": size}))


async def _point(n: int, k: int, rounds: int, warmup: int, prompt_len: int) -> dict:
    ours, theirs = socket.socketpair()
    engine = threading.Thread(target=_engine_side, args=(theirs,), daemon=True)
    engine.start()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    proc = types.SimpleNamespace(pid=0, exitcode=None, join=lambda timeout=None: None)
    info = {"vocab_size": 1 << 20, "max_total_tokens": 1 << 20, "max_new_tokens_cap": None}
    client = EngineProcessClient(proc, reader, writer, {**info, "startup_s": {}})
    prompt = array("q", range(prompt_len))
    submit_s = []
    queues = []
    for i in range(n):
        req = Request(f"r{i}", prompt, SamplingParams(max_new_tokens=1 << 20))
        t0 = time.perf_counter()
        queues.append(await client.submit(req))
        submit_s.append(time.perf_counter() - t0)
    loop_cpu: list[float] = []

    async def drain(q: asyncio.Queue, got: list) -> None:
        while True:
            await q.get()
            got[0] += 1
            if got[0] == n:
                got[0] = 0
                client._send(("ack",))
                loop_cpu.append(time.thread_time())

    got = [0]
    tasks = [asyncio.create_task(drain(q, got)) for q in queues]
    c0 = time.thread_time()
    out = await client._call("rounds", k, rounds, warmup)
    cpu = [b - a for a, b in zip([c0, *loop_cpu], loop_cpu)][warmup:]
    for t in tasks:
        t.cancel()
    client._send(("stop",))
    engine.join(10)
    client._reading.cancel()
    writer.close()
    return {
        "requests": n,
        "tokens_per_request": k,
        "engine_us": statistics.median(out["seconds"]) * 1e6,
        "server_loop_cpu_us": statistics.median(cpu) * 1e6,
        "bytes": out["bytes"],
        "prompt_tokens": prompt_len,
        "submit_us": statistics.median(submit_s[1:] or submit_s) * 1e6,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", default="32,256", help="running requests per round")
    ap.add_argument("--tokens", default="1,8", help="tokens each request emits per round")
    ap.add_argument("--prompt-len", type=int, default=125_000, help="tokens per submitted prompt")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = []
    for n in map(int, args.requests.split(",")):
        for k in map(int, args.tokens.split(",")):
            row = asyncio.run(_point(n, k, args.rounds, args.warmup, args.prompt_len))
            rows.append(row)
            print(
                f"N={n:4d} K={k}: engine thread {row['engine_us']:7.1f} us/round, "
                f"server loop {row['server_loop_cpu_us']:7.1f} us CPU/round, "
                f"{row['bytes']:6d} B; submit of {args.prompt_len} tokens "
                f"{row['submit_us']:.0f} us",
                flush=True,
            )
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        doc = {
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "python": platform.python_version(),
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
