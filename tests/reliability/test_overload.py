"""Overload: a bounded waiting queue answers 503 + Retry-After, the load generator counts those as
errors, and the server keeps serving afterwards. Real loopback HTTP end to end."""

from harness.loadgen import LoadConfig, run_load
from tests.reliability.support import PROMPTS, assert_drained, served, wait_idle

N = 60


async def test_flood_gets_503s_counted_as_errors_and_server_survives(tmp_path):
    async with served(
        "engine.max_waiting=4", "hardware.max_running_requests=2", "hardware.kv_pool_gib=0.01"
    ) as (s, eng, base):
        # everything at once: 2 run, 4 wait, the rest must be turned away at the door
        res = await run_load(
            LoadConfig(
                url=base,
                api="generate",
                request_rate=float("inf"),
                num_requests=N,
                input_len=23,
                output_len=12,
                prefixes=2,
                vocab_size=512,
                seed=3,
                out=str(tmp_path / "records.jsonl"),
                metrics_interval=0,
                quiet=True,
                disable_progress=True,
            )
        )
        recs = res.records
        assert len(recs) == N
        rejected = [r for r in recs if r.status == 503]
        ok = [r for r in recs if r.success]
        assert rejected, "the flood never hit the queue bound"
        assert len(ok) >= 4  # at least a full queue's worth was accepted and served
        assert res.summary["errors"] == N - len(ok) == len(rejected)
        assert res.summary["completed"] == len(ok)
        for r in rejected:
            assert not r.success and r.retry_after == 1.0
            assert "waiting queue is full" in r.error
        assert all(r.completion_tokens == 12 for r in ok)
        assert eng.stats["rejected_total"] == len(rejected)
        # the records file holds every request, rejected ones included
        assert sum(1 for _ in open(tmp_path / "records.jsonl")) == N

        await wait_idle(eng)
        assert_drained(eng)
        # and it still serves, with the queue bound intact
        r = await s.post(
            "/generate",
            json={
                "input_ids": PROMPTS[1],
                "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
            },
        )
        assert r.status == 200 and len((await r.json())["output_ids"]) == 5
        h = await s.get("/health")
        assert h.status == 200


async def test_openai_api_overload_is_also_503(tmp_path):
    async with served(
        "engine.max_waiting=1", "hardware.max_running_requests=1", "hardware.kv_pool_gib=0.01"
    ) as (s, eng, base):
        res = await run_load(
            LoadConfig(
                url=base,
                api="openai",
                request_rate=float("inf"),
                num_requests=20,
                input_len=5,
                output_len=8,
                prefixes=1,
                vocab_size=512,
                metrics_interval=0,
                quiet=True,
                disable_progress=True,
            )
        )
        codes = {r.status for r in res.records}
        assert 503 in codes and 200 in codes
        assert res.summary["errors"] == sum(r.status == 503 for r in res.records)
        await wait_idle(eng)
        assert_drained(eng)
