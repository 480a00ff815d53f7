"""The engine thread's outputs reach the event loop in batches, each stream's in order."""

from __future__ import annotations

import asyncio
import threading

from systems.engine.engine_client import _Outbox


def test_outputs_arrive_in_order_with_one_wakeup_per_batch():
    async def main():
        loop = asyncio.get_running_loop()
        box = _Outbox(loop)
        wakeups = []
        real = loop.call_soon_threadsafe

        def counted(cb, *args):
            wakeups.append(cb)
            return real(cb, *args)

        loop.call_soon_threadsafe = counted
        queues = [asyncio.Queue() for _ in range(3)]
        n = 200

        def engine():  # one "step" per i: an output for every stream
            for i in range(n):
                for j, q in enumerate(queues):
                    box.put(q, (j, i))

        t = threading.Thread(target=engine)
        t.start()
        got = [[] for _ in queues]
        for j, q in enumerate(queues):
            while len(got[j]) < n:  # a lost wake-up fails here, not at the suite's timeout
                got[j].append(await asyncio.wait_for(q.get(), timeout=10))
        t.join()
        return got, len(wakeups)

    got, wakeups = asyncio.run(main())
    assert got == [[(j, i) for i in range(200)] for j in range(3)]
    # a wake-up only while no drain is pending: far fewer than the 600 outputs
    assert 1 <= wakeups < 600


def test_a_closed_loop_drops_outputs_quietly():
    loop = asyncio.new_event_loop()
    box = _Outbox(loop)
    loop.close()
    box.put(asyncio.Queue(), ("x",))  # the engine thread must not fail
