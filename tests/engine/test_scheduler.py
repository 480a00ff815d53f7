import pytest
import torch

from systems.engine.request import Request, SamplingParams
from systems.engine.scheduler import QueueFull
from tests.helpers import golden_prompts, make_engine


def _req(eng, prompt, n):
    return Request(eng.new_rid(), prompt, SamplingParams(max_new_tokens=n))


def test_admission_waits_when_pool_is_full_and_resumes():
    # one request of 100 + 60 tokens needs 10 pages of 16; give the pool room for ~2
    eng = make_engine("hardware.kv_pool_gib=0.0001", "model.max_context_len=160")
    cap = eng.backend.pages.num_pages
    need = eng.cfg.model.pages_for(160)
    assert need <= cap < 3 * need
    prompt = golden_prompts()[4][:100]
    reqs = [_req(eng, prompt, 60) for _ in range(4)]
    for r in reqs:
        eng.submit(r)
    eng.step()
    running = len(eng.scheduler.running)
    assert running == cap // need
    assert len(eng.scheduler.waiting) == 4 - running
    assert eng.scheduler.wait_reason == "kv_pool_full"
    assert eng.metrics()["dhs_admission_blocked"] == 1.0
    eng.run_until_idle()
    assert all(len(r.output_ids) == 60 for r in reqs)
    # later requests were admitted only after earlier ones finished
    first_finish = min(r.finish_ts for r in reqs[:running])
    assert all(r.alloc_ts >= first_finish for r in reqs[running:])
    eng.backend.check_integrity()
    assert eng.backend.pages.num_used == 0 and eng.backend.is_empty


def test_slot_limit_caps_the_batch():
    eng = make_engine("hardware.max_running_requests=2", "hardware.kv_pool_gib=0.01")
    for p in golden_prompts():
        eng.submit(_req(eng, p, 5))
    eng.step()
    assert len(eng.scheduler.running) == 2
    assert eng.scheduler.wait_reason == "no_free_slot"
    eng.run_until_idle()
    eng.backend.check_integrity()


@pytest.mark.parametrize("system", ["resident", "hisparse"])
def test_handoffs_per_step_bound_lets_the_batch_decode_while_a_wave_joins(system):
    """engine.max_handoffs_per_step=2: five arrivals join two per round, and the requests
    already running decode a token in every round meanwhile; tokens are those of an
    unbounded engine (admission order and batch composition do not change greedy outputs)."""
    prompts = golden_prompts()[:5]
    outs = {}
    for bound in (0, 2):
        eng = make_engine(  # synchronous steps: the test counts the tokens each round delivers
            f"system={system}",
            "hardware.kv_pool_gib=0.01",
            f"engine.max_handoffs_per_step={bound}",
            "engine.overlap_schedule=false",
        )
        reqs = [_req(eng, p, 6) for p in prompts]
        for r in reqs:
            eng.submit(r)
        eng.step()
        if bound:
            assert len(eng.scheduler.running) == 2 and len(eng.scheduler.waiting) == 3
            assert eng.scheduler.wait_reason == ""  # not a memory wait
            eng.step()
            assert len(eng.scheduler.running) == 4
            assert len(reqs[0].output_ids) == 3  # first token + one decode step per round
        eng.run_until_idle()
        outs[bound] = [r.output_ids for r in reqs]
        eng.backend.check_integrity()
    assert outs[0] == outs[2]


def test_handoffs_in_flight_bound_waits_for_copies_not_for_steps(monkeypatch):
    """engine.max_handoffs_in_flight=2: no third handoff starts while two are still copying,
    however many steps pass; once they land, the next two start. Tokens are an unbounded
    engine's."""
    prompts = golden_prompts()[:5]
    outs = {}
    for bound in (0, 2):
        eng = make_engine(
            "system=hisparse", "hardware.kv_pool_gib=0.01", f"engine.max_handoffs_in_flight={bound}"
        )
        reqs = [_req(eng, p, 6) for p in prompts]
        for r in reqs:
            eng.submit(r)
        if bound:
            be = eng.backend
            landed = be.import_done
            monkeypatch.setattr(be, "import_done", lambda slot, wait=False: False)  # copying
            for _ in range(3):
                eng.step()
            assert len(eng.scheduler.arriving) == 2 and len(eng.scheduler.waiting) == 3
            assert eng.scheduler.wait_reason == ""  # not a memory wait
            monkeypatch.setattr(be, "import_done", landed)
            eng.step()
            assert len(eng.scheduler.running) == 2 and len(eng.scheduler.arriving) <= 2
        eng.run_until_idle()
        outs[bound] = [r.output_ids for r in reqs]
        eng.backend.check_integrity()
    assert outs[0] == outs[2]
    with pytest.raises(ValueError, match="max_handoffs_in_flight"):
        make_engine("engine.max_handoffs_in_flight=-1")


def test_negative_handoff_bound_is_a_clear_error():
    with pytest.raises(ValueError, match="max_handoffs_per_step"):
        make_engine("engine.max_handoffs_per_step=-1")


def test_bounded_waiting_queue_rejects():
    eng = make_engine("engine.max_waiting=2")
    p = golden_prompts()[0]
    eng.submit(_req(eng, p, 3))
    eng.submit(_req(eng, p, 3))
    with pytest.raises(QueueFull):
        eng.submit(_req(eng, p, 3))
    assert eng.metrics()["dhs_rejected_total"] == 1


@pytest.mark.parametrize("system", ["resident", "hisparse"])
def test_request_past_the_context_is_refused_at_submit(system):
    """prompt + output cap over the context: a clear error at submit (the HTTP server's 400),
    not a failed admission; a request that fits exactly is accepted."""
    eng = make_engine(f"system={system}", "model=tiny")
    total = eng.backend.max_total_tokens
    with pytest.raises(ValueError, match="exceeds the context"):
        eng.submit(_req(eng, [5] * (total - 3), 4))
    eng.submit(_req(eng, [5] * (total - 4), 4))
    assert eng.metrics()["dhs_rejected_total"] == 0


def test_abort_frees_pages_running_and_waiting():
    eng = make_engine("hardware.max_running_requests=1", "hardware.kv_pool_gib=0.01")
    p = golden_prompts()[2]
    a, b = _req(eng, p, 50), _req(eng, p, 50)
    eng.submit(a)
    eng.submit(b)
    eng.step()
    eng.step()
    assert a.slot in eng.scheduler.running and b in eng.scheduler.waiting
    eng.abort(a)
    eng.abort(b)
    eng.step()
    assert a.finish_reason == {"type": "abort"} and b.finish_reason == {"type": "abort"}
    eng.backend.check_integrity()
    assert eng.backend.pages.num_used == 0


def test_a_request_aborted_after_intake_is_not_admitted_before_its_abort():
    """An abort that lands between a round's intake and its admission: the request is not
    admitted (no slot, no handoff); the next intake ends it."""
    eng = make_engine("system=hisparse", "hardware.kv_pool_gib=0.01")
    req = Request(eng.new_rid(), golden_prompts()[0], SamplingParams(max_new_tokens=4))
    eng.submit(req)
    eng._intake()
    eng.abort(req)
    assert eng.scheduler.admit() == [] and req.slot == -1 and eng.backend.is_empty
    eng._intake()
    assert req.finish_reason == {"type": "abort"} and not eng.scheduler.waiting


def test_a_stop_matcher_that_raises_fails_its_request_only():
    """The server's stop-string matcher runs on the engine thread after every token: if it
    raises, its request ends with an error and frees its slot; the others finish normally."""

    def broken(ids):
        raise ValueError("bad matcher")

    eng = make_engine("system=hisparse", "hardware.kv_pool_gib=0.01")
    bad = Request(eng.new_rid(), golden_prompts()[0], SamplingParams(max_new_tokens=6, stop=broken))
    good = Request(eng.new_rid(), golden_prompts()[1], SamplingParams(max_new_tokens=6))
    for r in (bad, good):
        eng.submit(r)
    eng.run_until_idle()
    assert bad.finish_reason["type"] == "error" and "bad matcher" in bad.finish_reason["message"]
    assert good.finish_reason["type"] == "length" and len(good.output_ids) == 6
    assert eng.stats["failed_total"] == 1 and eng.stats["finished_total"] == 1
    eng.backend.check_integrity()
    assert eng.backend.is_empty


def test_timestamps_are_ordered():
    eng = make_engine()
    r = _req(eng, golden_prompts()[1], 4)
    eng.submit(r)
    eng.run_until_idle()
    assert r.arrival_ts <= r.prefill_done_ts <= r.alloc_ts <= r.handoff_done_ts
    assert r.handoff_done_ts <= r.first_token_ts <= r.finish_ts
    assert len(r.token_ts) == 4
    t = r.timing()
    # Table A2's split: waiting for a slot after the prefill, then the handoff
    assert t["alloc_wait_s"] == pytest.approx(r.alloc_ts - r.prefill_done_ts)
    assert t["handoff_s"] == pytest.approx(r.handoff_done_ts - r.alloc_ts)


def test_a_request_waiting_for_a_slot_counts_that_wait_as_allocation_wait():
    """With one slot, the second request waits for the first to finish: its allocation wait
    spans about the first's decode, the first's is about nothing."""
    eng = make_engine("hardware.max_running_requests=1")
    a, b = (_req(eng, p, 24) for p in golden_prompts()[:2])
    for r in (a, b):
        eng.submit(r)
    eng.run_until_idle()
    ta, tb = a.timing(), b.timing()
    assert ta["alloc_wait_s"] < 0.5 * (a.finish_ts - a.handoff_done_ts)
    assert tb["alloc_wait_s"] >= 0.8 * (a.finish_ts - a.handoff_done_ts)
    assert b.alloc_ts >= a.finish_ts - 1e-3  # its slot came free when a finished


def test_temperature_sampling_runs_and_differs_from_greedy():
    eng = make_engine()
    p = golden_prompts()[3]
    hot = Request(eng.new_rid(), p, SamplingParams(max_new_tokens=20, temperature=5.0))
    cold = Request(eng.new_rid(), p, SamplingParams(max_new_tokens=20, temperature=0.0))
    eng.submit(hot)
    eng.submit(cold)
    eng.run_until_idle()
    assert len(hot.output_ids) == 20 and hot.output_ids != cold.output_ids


def test_engine_time_counters_split_admission_decode_and_captures():
    """/metrics accounts the engine thread's time: admission rounds, decode steps, and the
    steps that recorded a graph (emulated capture on CPU: one per new batch size; none at
    start-up here, so every capture is a step's)."""
    eng = make_engine("+engine.cuda_graph_emulate=true")
    prompts = golden_prompts()[:3]
    for p in prompts:
        eng.submit(_req(eng, p, 4))
    eng.run_until_idle()
    m = eng.metrics()
    assert m["dhs_handoffs_total"] == 3
    assert m["dhs_admit_seconds_total"] > 0 and m["dhs_decode_seconds_total"] > 0
    assert m["dhs_graph_captures_total"] >= 1
    assert m["dhs_capture_steps_total"] == m["dhs_graph_captures_total"]
    assert 0 < m["dhs_capture_step_seconds_total"] <= m["dhs_decode_seconds_total"]


def test_decode_gpu_time_is_reported_only_where_events_measure_it():
    """CPU: no CUDA events, so no GPU time and no share (rather than a made-up 1.0)."""
    eng = make_engine()
    eng.submit(_req(eng, golden_prompts()[0], 3))
    eng.run_until_idle()
    m = eng.metrics()
    assert m["dhs_decode_gpu_seconds_total"] == 0.0 and m["dhs_decode_seconds_total"] > 0
    assert "dhs_decode_gpu_share" not in m


class _Clock:
    """Stands in for the GPU's clock: events record its current time."""

    t = 0.0


class _Event:
    def record(self):
        self.t = _Clock.t

    def query(self):
        return True

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _step(gpu_time, t0, t1):
    _Clock.t = t0
    ev = gpu_time.start()
    _Clock.t = t1
    gpu_time.stop(ev)


def test_decode_gpu_share_counts_the_gaps_between_steps_not_idle_time():
    """Steps of one busy period: their spans over the timeline from the first start to the
    last end; a pause (nothing to decode) starts a new period, its gap uncounted."""
    from systems.engine.engine import DecodeGpuTime

    g = DecodeGpuTime(torch.device("cuda"), event=_Event)
    _step(g, 0.0, 1.0)
    _step(g, 1.5, 2.5)  # 0.5 s of the GPU waiting for the host
    assert (g.seconds, g.span_seconds) == (2.0, 2.5)
    g.pause()
    _step(g, 10.0, 11.0)  # after an idle period: its gap is not the host's overhead
    assert (g.seconds, g.span_seconds) == (3.0, 3.5)
    assert DecodeGpuTime(torch.device("cpu")).start() is None


@pytest.mark.gpu
def test_decode_gpu_share_is_a_share_of_the_gpu_timeline():
    eng = make_engine("device=cuda")
    for p in golden_prompts()[:3]:
        eng.submit(_req(eng, p, 8))
    eng.run_until_idle()
    m = eng.metrics()
    assert 0 < m["dhs_decode_gpu_seconds_total"] <= m["dhs_decode_gpu_span_seconds_total"]
    assert 0 < m["dhs_decode_gpu_share"] <= 1


def test_engine_records_its_start_up_phases():
    eng = make_engine("system=hisparse", "model=tiny")
    assert set(eng.startup_s) == {"model", "decoder", "kv_backend"}
    assert all(v >= 0 for v in eng.startup_s.values())
