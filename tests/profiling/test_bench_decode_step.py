"""The decode-step benchmark's busy share and kernel count from a profiler trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_decode_step as B  # noqa: E402


def _x(name, cat, ts, dur):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur}


def test_union_of_overlapping_intervals():
    assert B.union_ms([(0, 10), (5, 20), (30, 40), (35, 36)]) == 0.03
    assert B.union_ms([]) == 0.0


def test_busy_share_counts_kernels_and_copies_inside_the_step_window():
    ev = [
        _x("k0", "kernel", -50, 20),  # before the first step: not counted
        _x(B.STEP_RANGE, "user_annotation", 0, 100),
        _x("k", "kernel", 10, 50),
        _x("k", "kernel", 40, 30),
        _x("m", "gpu_memcpy", 90, 10),
        _x(B.STEP_RANGE, "user_annotation", 100, 100),
        _x("k", "kernel", 150, 100),
    ]
    got = B.trace_activity({"traceEvents": ev})
    # busy: [10, 70) + [90, 100) + [150, 250) = 170 us of a [0, 250) window
    assert got["busy_share"] == 170 / 250
    assert got["kernels_per_step"] == 1.5
    assert B.trace_activity({"traceEvents": []}) == {"busy_share": None, "kernels_per_step": None}


def test_kernel_names_sharing_a_prefix_add_up():
    long_a, long_b = "k" * 80 + "<int>", "k" * 80 + "<long>"
    ev = [
        _x(B.STEP_RANGE, "user_annotation", 0, 100),
        _x(long_a, "kernel", 10, 5),
        _x(long_b, "kernel", 20, 7),
        _x("short", "kernel", 30, 3),
    ]
    got = B.trace_activity({"traceEvents": ev})
    assert got["top_kernels"] == {"k" * 80: 2.0, "short": 1.0}
    assert got["top_kernel_us"] == {"k" * 80: 12.0, "short": 3.0}


class _Torch:  # write_rows asks torch for the GPU name only when env has none
    class cuda:
        @staticmethod
        def get_device_name():
            return "GPU"


def test_rows_are_merged_after_each_row_with_round_over_step(tmp_path):
    import json

    out = tmp_path / "summary.json"
    old = {"model": "m", "system": "hisparse", "batch": 8, "context": 16, "step_ms": 9.0}
    out.write_text(json.dumps({"rows": [old]}))
    env = {"git_commit": "abc", "gpu": "H"}
    rows = [{"model": "m", "system": "hisparse", "batch": 1, "context": 16, "step_ms": 1.0}]
    rows.append({**rows[0], "system": "adaptive_hisparse", "step_ms": 2.0})
    B.write_rows(out, rows, env, [], _Torch)
    rows.append(
        {"model": "m", "system": "spec", "batch": 1, "context": 16, "step_ms": 5.0, "phases_ms": {}}
    )
    B.write_rows(out, rows, env, [], _Torch)
    rec = json.loads(out.read_text())
    by = {(r["system"], r["batch"]): r for r in rec["rows"]}
    assert set(by) == {("hisparse", 8), ("hisparse", 1), ("adaptive_hisparse", 1), ("spec", 1)}
    # the round against the plain step of its own build, not the baseline's (the old row is kept)
    assert by[("spec", 1)]["round_over_step"] == 2.5
    assert by[("spec", 1)]["round_base"] == "adaptive_hisparse"
    assert by[("spec", 1)]["round_base_step_ms"] == 2.0  # readable if that row is replaced
    assert by[("hisparse", 1)]["round_over_step"] is None
    assert rec["commit"] == "abc" and by[("spec", 1)]["commit"] == "abc"
    assert not out.with_suffix(".tmp").exists()


class _FakeEngine:
    """Admits what was submitted in one step; a wave arrives ``lag`` steps later."""

    def __init__(self, lag: int):
        self.lag = lag
        self.submitted, self.left, self.steps, self.wave = 0, 0, 0, 0
        self.stats = {"handoffs_total": 0}
        self.scheduler = type("S", (), {"arriving": {}, "running": {}})()
        # a backend whose host backups count the steps run
        self.backend = type(
            "Be", (), {"metrics": lambda _: {"dhs_host_backup_rows_total": self.steps}}
        )()

    def new_rid(self):
        return f"r{self.submitted}"

    def submit(self, req):
        self.submitted += 1

    def step(self):
        self.steps += 1
        if self.submitted and not self.scheduler.arriving:
            self.wave = self.submitted
            self.scheduler.arriving, self.left, self.submitted = {0: 1}, self.lag, 0
        elif self.scheduler.arriving:
            self.left -= 1
            if self.left <= 0:
                self.scheduler.arriving = {}
                self.stats["handoffs_total"] += self.wave  # the engine counts requests landed


class _FakeTorch:
    class cuda:
        @staticmethod
        def current_stream():
            return type("St", (), {"synchronize": staticmethod(lambda: None)})()

        @staticmethod
        def synchronize():
            pass


def test_handoff_steps_repeat_waves_until_enough_steps_saw_copies_in_flight():
    args = type("A", (), {"host_profile": 0})()
    eng = _FakeEngine(lag=3)  # per wave: two steps with copies in flight, then the landing
    row = B.handoff_steps(eng, [1, 2, 3], args, _FakeTorch)
    assert row["handoff_steps"] == 8 and row["handoff_waves"] == 4  # 4 waves to reach 8
    assert row["handoff_arrival_steps"] == 4  # the landing steps are timed apart
    assert eng.steps == 16  # an admitting step per wave, not timed as in flight
    assert row["handoff_counters"] == {"dhs_host_backup_rows_total": 16}
    assert row["handoff_backup_rows_per_step"] == 1.0  # 16 rows over the waves' 16 steps
    assert row["handoff_host_rows_per_step"] is None  # a counter the backend lacks
    assert row["handoff_wave_ms"] is not None and row["handoff_wave_ms"] >= 0
    slow = _FakeEngine(lag=10_000)  # never arrives: the step budget ends it
    row = B.handoff_steps(slow, [1], args, _FakeTorch)
    assert slow.steps == B.HANDOFF_STEPS and row["handoff_waves"] == 1
    assert row["handoff_wave_ms"] is None  # a wave that never landed has no time


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_wave_trace_profiles_one_wave_from_admission_to_landing():
    """--handoff-trace: one more wave, its admitting step to its landing, each step timed (on a
    CPU the profiler sees no GPU work, so no stream); an earlier wave still arriving lands
    first, outside the profile, and one that does not land marks the trace unclean."""
    eng = _FakeEngine(lag=3)
    got = B._wave_trace(eng, [1, 2, 3], lambda: None, _FakeTorch)
    assert eng.steps == 4 and len(got["steps_ms"]) == 4  # admit, 2 in flight, the landing
    assert eng.stats["handoffs_total"] == B.HANDOFFS and got["streams"] == {}
    assert got["clean_start"] and got["landed"] and got["batch"] == [0, 0]
    late = _FakeEngine(lag=3)
    late.scheduler.arriving, late.left = {0: 1}, 2  # an earlier wave two steps from landing
    got = B._wave_trace(late, [1], lambda: None, _FakeTorch)
    assert got["clean_start"] and late.steps == 2 + 4 and len(got["steps_ms"]) == 4
    assert late.stats["handoffs_total"] == B.HANDOFFS  # the earlier wave had no requests here
    stuck = _FakeEngine(lag=3)
    stuck.scheduler.arriving, stuck.left = {0: 1}, 10_000  # an earlier wave that never lands
    got = B._wave_trace(stuck, [1], lambda: None, _FakeTorch)
    assert not got["clean_start"] and not got["landed"]
    assert len(got["steps_ms"]) == B.EXTRA_WAVE_STEPS


def test_pipelined_wave_times_the_plain_steps_then_the_wave_back_to_back():
    """--handoff-pipelined: one pipeline of steps, synchronized once at the end: a first step,
    the timed plain steps, then the wave from its admitting step until every request of it
    landed; a wave whose admission is deferred has not landed."""
    eng = _FakeEngine(lag=3)
    syncs = []
    got = B._pipelined_wave(eng, [1, 2], lambda: syncs.append(eng.steps), _FakeTorch)
    assert eng.steps == 1 + B.PIPELINED_PLAIN_STEPS + 4  # first, plain, admit, 2, landing
    assert syncs == [eng.steps]  # no synchronization inside the pipeline
    assert got["handoff_pipelined_steps"] == 4 and got["handoff_pipelined_landed"]
    assert got["handoff_pipelined_clean_start"] and got["handoff_pipelined_batch"] == [0, 0]
    assert got["handoff_pipelined_step_ms"] >= 0 and got["handoff_pipelined_plain_step_ms"] >= 0
    never = _FakeEngine(lag=10_000)  # a wave that never lands: the step budget ends it
    got = B._pipelined_wave(never, [1], lambda: None, _FakeTorch)
    assert got["handoff_pipelined_steps"] == B.EXTRA_WAVE_STEPS
    assert not got["handoff_pipelined_landed"]

    class Deferred(_FakeEngine):  # admission put off (a bound): nothing arrives
        def step(self):
            self.steps += 1

    got = B._pipelined_wave(Deferred(lag=1), [1], lambda: None, _FakeTorch)
    assert not got["handoff_pipelined_landed"]
    assert got["handoff_pipelined_steps"] == B.EXTRA_WAVE_STEPS


def test_wave_activity_splits_the_gpu_work_by_stream():
    """A handoff wave's trace: the decode stream's kernels and the handoff stream's copy kernel
    and DMA apart, busiest stream first, with the top kernels by time."""

    def ev(cat, stream, dur, name="k", nbytes=None, ts=0.0):
        args = {"stream": stream, **({"bytes": nbytes} if nbytes is not None else {})}
        return {"cat": cat, "ph": "X", "ts": ts, "dur": dur, "name": name, "args": args}

    trace = {
        "traceEvents": [
            ev("kernel", 7, 300.0, "gemm"),
            ev("kernel", 7, 100.0, "attention", ts=1000.0),  # after a gap
            ev("kernel", 7, 50.0, "gemm", ts=1050.0),  # overlaps the attention
            ev("kernel", 13, 900.0, "_copy_rows_kernel"),
            ev("gpu_memcpy", 13, 2000.0, "Memcpy DtoH", nbytes=4_000_000_000),
            ev("gpu_memset", 7, 10.0, "Memset", nbytes=1_000_000_000),  # no copy
            ev("cpu_op", 7, 5000.0, "aten::mm"),  # host work: not the GPU's
            {"cat": "kernel", "ph": "i", "name": "marker", "args": {"stream": 7}},
        ]
    }
    got = B.wave_activity(trace, top=1)
    assert list(got) == ["13", "7"]  # the handoff stream did more
    top = got["13"].pop("top_kernel_us")
    assert top == {"_copy_rows_kernel": 900.0}
    assert got["13"].pop("range_ms") == pytest.approx({"(no range)": 2.9})
    assert got["13"] == pytest.approx(
        {"kernel_ms": 0.9, "memcpy_ms": 2.0, "memcpy_gb": 4.0, "memset_ms": 0.0, "busy_ms": 2.0}
    )  # its kernel and its copy overlap from t = 0
    # the decode stream: 0-300 us, then 1000-1100 us (the gemm inside the attention)
    assert got["7"]["busy_ms"] == pytest.approx(0.4)
    assert got["7"]["kernel_ms"] == pytest.approx(0.45) and got["7"]["memcpy_gb"] == 0
    assert got["7"]["memset_ms"] == pytest.approx(0.01)
    assert got["7"]["top_kernel_us"] == {"gemm": 350.0}  # one entry per name, summed
    assert got["7"]["range_ms"] == pytest.approx({"(no range)": 0.45})  # memsets left out
    assert B.wave_activity({}) == {}


def test_wave_activity_splits_each_stream_by_the_ranges_that_queued_its_work():
    """A reclaim's backup kernel launched inside an admission, the admission's own copy, a
    population kernel and a graph replay: each stream's time goes to the engine ranges open
    around its launch, outermost first."""

    def rng(name, ts, dur, tid=1):
        return {"name": name, "cat": "user_annotation", "ph": "X", "ts": ts, "dur": dur,
                "tid": tid}  # fmt: skip

    def launch(ts, corr, name="cudaLaunchKernel", tid=1):
        return {"name": name, "cat": "cuda_runtime", "ph": "X", "ts": ts, "dur": 1, "tid": tid,
                "args": {"correlation": corr}}  # fmt: skip

    def gpu(cat, stream, corr, dur, name="k"):
        return {"cat": cat, "ph": "X", "ts": 100.0, "dur": dur, "name": name,
                "args": {"stream": stream, "correlation": corr}}  # fmt: skip

    trace = {
        "traceEvents": [
            rng("dhs::step", 0, 10),
            rng("dhs::handoff", 20, 20),
            rng("dhs::backup", 22, 5),  # a reclaim's backup inside the admission
            rng("dhs::populate", 50, 5),
            rng("bench_decode_step", 0, 60),  # not an engine range
            rng("dhs::backup", 0, 100, tid=2),  # another thread's range: not around tid 1
            launch(5, 1, "cudaGraphLaunch"),
            launch(23, 2),
            launch(30, 3, "cudaMemcpy2DAsync"),
            launch(52, 4, "cuLaunchKernel"),
            launch(70, 5),  # outside every range
            launch(55, 6),  # at the populate range's end: half-open, outside it
            # the profiler's device-side shadow of a range: not a host range
            {
                "name": "dhs::backup",
                "cat": "gpu_user_annotation",
                "ph": "X",
                "ts": 0,
                "dur": 100,
                "tid": 1,
            },  # fmt: skip
            gpu("kernel", 7, 6, 250.0, "argmax"),
            gpu("kernel", 7, 1, 4000.0, "gemm"),
            gpu("kernel", 7, 2, 3000.0, "_copy_rows_kernel"),
            gpu("gpu_memcpy", 13, 3, 2000.0, "Memcpy DtoH"),
            gpu("kernel", 7, 4, 1000.0, "_copy_rows_kernel"),
            gpu("kernel", 7, 5, 500.0, "argmax"),
        ]
    }
    got = B.wave_activity(trace)
    assert got["7"]["range_ms"] == pytest.approx(
        {
            "dhs::step": 4.0,
            "dhs::handoff > dhs::backup": 3.0,
            "dhs::populate": 1.0,
            "(no range)": 0.75,
        }  # fmt: skip
    )
    assert list(got["7"]["range_ms"])[0] == "dhs::step"  # largest first
    assert got["13"]["range_ms"] == pytest.approx({"dhs::handoff": 2.0})


def test_phase_kernels_attribute_kernels_to_the_range_that_launched_them():
    from systems.spec.decoder import PHASE_RANGE

    def launch(ts, corr, tid=1, name="cudaLaunchKernel", cat="cuda_runtime"):
        return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": 1, "tid": tid,
                "args": {"correlation": corr}}  # fmt: skip

    def kernel(name, corr, dur):
        return {"name": name, "cat": "kernel", "ph": "X", "ts": 1000 + corr, "dur": dur,
                "args": {"correlation": corr}}  # fmt: skip

    ev = [
        {
            "name": PHASE_RANGE + "propose",
            "cat": "user_annotation",
            "ph": "X",
            "ts": 0,
            "dur": 10,
            "tid": 1,
        },  # fmt: skip
        {
            "name": PHASE_RANGE + "verify",
            "cat": "user_annotation",
            "ph": "X",
            "ts": 10,
            "dur": 10,
            "tid": 1,
        },  # fmt: skip
        launch(2, 1),
        launch(5, 2, name="cuLaunchKernel", cat="cuda_driver"),  # a Triton kernel
        launch(12, 3, name="cudaGraphLaunch"),
        launch(30, 4),  # outside every phase: not attributed
    ]
    kern = [kernel("a", 1, 4), kernel("b", 2, 6), kernel("g1", 3, 10), kernel("g2", 3, 20),
            kernel("x", 4, 99)]  # fmt: skip
    out = B.phase_kernels(ev + kern, kern, steps=2)["phase_kernel_us"]
    assert out["propose"]["total"] == 5 and out["propose"]["top"] == {"b": 3, "a": 2}
    assert out["verify"]["total"] == 15 and set(out["verify"]["top"]) == {"g1", "g2"}
    assert B.phase_kernels(kern, kern, steps=1) == {}


def test_phase_timer_opens_a_range_per_phase():
    import torch

    from systems.spec.decoder import PHASE_RANGE, PhaseTimer

    pt = PhaseTimer(torch.device("cpu"), ranges=True)
    marks = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(len(PhaseTimer.PHASES) + 1):
            pt.mark(marks)
    names = [e.name for e in prof.events() if e.name.startswith(PHASE_RANGE)]
    assert names == [PHASE_RANGE + p for p in PhaseTimer.PHASES]
    assert len(pt.ms()["propose"]) == 0 and len(marks) == 5  # the rounds list is the caller's


def test_a_row_stays_in_one_graph_scan_bucket():
    """A row whose positions would cross a scan bucket starts at the next bucket instead (a
    crossing captures new graphs among the timed steps); one that fits keeps its context."""
    assert B.bucket_context(16384, 1368, 2048) == 16384  # 16,385 .. 17,753: one bucket
    assert B.bucket_context(49000, 1368, 2048) == 49152  # would cross 49,152
    got = B.bucket_context(49000, 1368, 2048)
    assert -(-(got + 1) // 2048) == -(-(got + 1368 + 1) // 2048)
    assert B.bucket_context(1000, 5000, 2048) == 1000  # cannot fit any bucket: left alone


def test_the_landing_profile_is_the_step_in_which_a_wave_lands():
    """--host-profile's landing profile: a further wave of arrivals is admitted, and the first
    step in which they land (not the steps while their copies are in flight) is profiled; the
    running batch keeps decoding meanwhile. Handoffs held in flight by the stand-in event of
    tests/engine/test_handoff.py."""
    from types import SimpleNamespace

    from systems.engine.request import Request, SamplingParams
    from tests.engine.test_handoff import _engine, slow_handoffs
    from tests.helpers import golden_prompts

    eng = _engine("hisparse", "hardware.max_running_requests=6")
    slow_handoffs(eng, 3)
    prompt = golden_prompts()[0]
    running = Request(eng.new_rid(), prompt, SamplingParams(max_new_tokens=200))
    eng.submit(running)
    while not eng.scheduler.running:
        eng.step()
    before = len(running.output_ids)
    steps = []
    step = eng.step
    eng.step = lambda: steps.append(eng.stats["handoffs_total"]) or step()
    rows = B._landing_profile(eng, prompt, SimpleNamespace(host_profile=5), lambda: None)
    assert rows and len(rows) <= 5 and all(r["calls_per_step"] > 0 for r in rows)
    # admitted, then in flight for a few steps, then the profiled step in which requests landed
    assert len(steps) >= 3 and steps[-2] == steps[-1] < eng.stats["handoffs_total"]
    assert len(running.output_ids) > before  # the batch decoded through the wave


def test_rows_on_an_experiment_take_its_pool_drafter_and_sampling():
    """--experiment fig4_h200: the rows decode in its served state (its 3.93 GiB pool, 52 slots,
    sampled outputs, the 512-wide drafter, its model), where the default rows had a 24 GiB pool
    (adaptive residency then held most of the history: a block-4 round fetched 27x fewer host
    rows than fig4_h200's served rounds) and greedy outputs; --kv-pool-gib still overrides."""
    from argparse import Namespace

    def args(**kw):
        base = dict(experiment=None, models=None, temperature=None, kv_pool_gib=None, context=None)
        return Namespace(**{**base, **kw, "overrides": []})

    a = args(experiment="fig4_h200")
    cfg = B.row_configs(a, [1, 8, 32], 30)(a.models, "adaptive_dhisparse")
    assert (a.models, a.temperature, a.kv_pool_gib) == ("glm53_h200", 1.0, None)
    assert a.context == 50000  # its input: 30 rounds' 248 positions fit its 51,072
    b = args(experiment="fig4_h200")
    B.row_configs(b, [1], 200)
    assert b.context == 49152  # 1,608 positions do not: the scan bucket's start below
    assert cfg.hardware.kv_pool_gib == 3.93 and cfg.hardware.max_running_requests == 52
    spec = cfg.system.speculation
    assert (spec.draft_dim, spec.acceptance) == (512, "calibrated")
    assert cfg.workload.input_len == 50000
    a = args(experiment="fig4_h200", kv_pool_gib=6.0, models="glm53_mini")
    assert B.row_configs(a, [64], 30)("glm53_mini", "hisparse").hardware.kv_pool_gib == 6.0
    assert B.row_configs(a, [64], 30)("glm53_mini", "hisparse").hardware.max_running_requests == 68
    a = args()
    cfg = B.row_configs(a, [1, 8, 32], 30)(a.models, "adaptive_dhisparse")
    assert (a.models, a.temperature, cfg.hardware.kv_pool_gib) == ("glm53_mini", 0.0, 24.0)
    assert a.context == 16384
    assert cfg.system.speculation.acceptance == "calibrated"


def test_merge_puts_a_batch_s_rows_over_the_committed_ones(tmp_path, capsys, monkeypatch):
    """--merge: a GPU batch's summary replaces the committed rows of its keys, keeps the others
    with their commits, and its gpu / commit head the file."""
    import json

    dst, src = tmp_path / "summary.json", tmp_path / "batch.json"

    def row(batch, ms, commit):
        return {"model": "m", "system": "h", "batch": batch, "context": 16, "step_ms": ms,
                "commit": commit}  # fmt: skip

    dst.write_text(
        json.dumps({"gpu": "H200", "commit": "a", "rows": [row(1, 9.0, "a"), row(8, 9.5, "a")]})
    )
    src.write_text(json.dumps({"gpu": "H200", "commit": "b", "rows": [row(8, 5.0, "b")]}))
    monkeypatch.setattr(
        sys, "argv", ["bench_decode_step.py", "--out", str(dst), "--merge", str(src)]
    )
    B.main()
    rec = json.loads(dst.read_text())
    assert (rec["gpu"], rec["commit"]) == ("H200", "b")
    assert {(r["batch"], r["step_ms"], r["commit"]) for r in rec["rows"]} == {
        (1, 9.0, "a"),
        (8, 5.0, "b"),
    }
    assert "2 rows" in capsys.readouterr().out
    # a row of the same batch in another experiment's state is another row
    src.write_text(json.dumps({"rows": [{**row(8, 7.0, "c"), "experiment": "fig4_h200"}]}))
    B.merge_rows(dst, [src])
    rows = json.loads(dst.read_text())["rows"]
    assert sorted((r["step_ms"], r.get("experiment")) for r in rows) == [
        (5.0, None),
        (7.0, "fig4_h200"),
        (9.0, None),
    ]
    # rows of another kind of GPU do not join the file's, which are compared with each other
    src.write_text(json.dumps({"gpu": "H100", "commit": "d", "rows": [row(32, 4.0, "d")]}))
    with pytest.raises(SystemExit, match="rows measured on H100 do not go into"):
        B.main()
    assert json.loads(dst.read_text())["rows"] == rows


def test_variants_interleave_and_their_rows_stay_apart(tmp_path):
    """--variants / --repeats: each set's rows carry its overrides and repeat, keep their own
    keys in the summary beside the build's rows, divide a round by the plain step of the same
    set and repeat, and the table puts each set against the first with the paired range."""
    import json

    assert B.parse_variants(None) == [()]
    assert B.parse_variants("a=1 b=2;;c=3") == [("a=1", "b=2"), (), ("c=3",)]
    assert B.parse_variants("'x=[1, 2]'") == [("x=[1, 2]",)]
    with pytest.raises(ValueError, match="twice"):
        B.parse_variants("a=1;a=1")
    out = tmp_path / "summary.json"
    own = {"model": "m", "system": "adaptive_hisparse", "batch": 8, "context": 16, "step_ms": 4.0}
    out.write_text(json.dumps({"rows": [{**own, "batch": 1, "step_ms": 2.0}, own]}))
    rows = []
    for rep in (1, 2):
        for v, plain, spec in ((["w=1"], 4.0, 8.0), (["w=2"], 4.0 + rep, 12.0)):
            for system, ms in (("adaptive_hisparse", plain), ("spec", spec)):
                rows.append(
                    {"model": "m", "system": system, "batch": 8, "context": 16, "step_ms": ms,
                     "overrides": v, "repeat": rep, **({"phases_ms": {}} if system == "spec" else {})}
                )  # fmt: skip
    B.write_rows(out, rows, {"git_commit": "abc"}, [], _Torch)
    rec = json.loads(out.read_text())["rows"]
    assert len(rec) == 10  # the build's own two rows and 8 of the sweep
    spec = {
        (tuple(r["overrides"]), r["repeat"]): r["round_over_step"]
        for r in rec
        if r["system"] == "spec"
    }
    assert spec == {(("w=1",), 1): 2.0, (("w=1",), 2): 2.0, (("w=2",), 1): 2.4, (("w=2",), 2): 2.0}
    table = B.variant_table(rows, [["w=1"], ["w=2"]])
    line = next(t for t in table if "adaptive_hisparse" in t and "w=2" in t)
    # medians 4.0 and 5.5: 1.375; repeat by repeat 5 / 4 and 6 / 4
    assert "1.375 (1.250-1.500)" in line
    from figures.fig4 import bench_step_at

    pipelined = [{**r, "step_ms_pipelined": r["step_ms"]} for r in rec]
    got = bench_step_at(pipelined, "m", "adaptive_hisparse", 8)
    assert got is not None and got["ms"] == 4.0  # the build's own row, not the sweep's


def test_the_floor_counts_what_a_step_reads_once():
    """The indexer reads a request's keys once per call whatever its queries; the embedding
    table only the gathered rows; a round adds its drafter's passes (DSpark one per draft)."""
    from types import SimpleNamespace

    from systems.models.config import ModelConfig

    m = ModelConfig()
    one, four = B.floor_bytes(m, 2, 1024, 1), B.floor_bytes(m, 2, 1024, 4)
    assert four["index_scan_bytes"] == one["index_scan_bytes"]
    assert four["selected_kv_bytes"] == 4 * one["selected_kv_bytes"]
    assert one["weight_bytes"] == m.weight_bytes(2) - (m.vocab_size - 2) * m.hidden_size * 2
    ring = SimpleNamespace(nbytes=8000, num_slots=8)  # 1,000 bytes a request's window

    def drafter(name):
        return SimpleNamespace(name=name, fixed_bytes=10_000 + 8000, ring=ring)

    lm = m.hidden_size * m.vocab_size * 2
    per_pass = 10_000 + lm + 2 * 1000
    assert B.floor_bytes(m, 2, 1024, 4, drafter("dflash2"))["drafter_bytes"] == (
        per_pass + 10_000 + 2 * 1000
    )
    assert B.floor_bytes(m, 2, 1024, 4, drafter("dspark"))["drafter_bytes"] == (
        3 * per_pass + 10_000 + 2 * 1000
    )


class _FillEngine:
    """Admits one request a step (``every``); each running request finishes after ``cap``
    steps of decoding."""

    def __init__(self, reqs, cap: int, every: int = 1):
        self.reqs, self.cap, self.every, self.t = list(reqs), cap, every, 0
        self.scheduler = type("S", (), {"running": [], "wait_reason_counts": {"kv_pool_full": 3}})()
        self.age = {}

    def step(self):
        self.t += 1
        for r in list(self.scheduler.running):
            self.age[r] += 1
            if self.age[r] >= self.cap:
                r.finish_reason = {"type": "length"}
                self.scheduler.running.remove(r)
        if self.reqs and self.t % self.every == 0:
            r = self.reqs.pop(0)
            self.age[r] = 0
            self.scheduler.running.append(r)


def _reqs(n):
    return [type("R", (), {"finish_reason": None})() for _ in range(n)]


def test_a_batch_that_cannot_fill_is_named_not_waited_for_forever():
    reqs = _reqs(4)
    assert B.fill_batch(_FillEngine(reqs, cap=10), reqs, 4) == 4  # one admitted a step
    reqs = _reqs(4)
    # admission slower than the output cap: the first request finishes before the last is in
    with pytest.raises(RuntimeError, match=r"did not fill within 8 steps: 1 running, 1 requests"):
        B.fill_batch(_FillEngine(reqs, cap=5, every=3), reqs, 4, allowance=20)
    # slower than the caps spare before the replay (no request finished yet): stopped
    reqs = _reqs(2)
    spare = B.CAP_SLACK + B.HANDOFF_STEPS
    with pytest.raises(RuntimeError, match=rf"within {spare + 1} steps: 0 running; admission"):
        B.fill_batch(_FillEngine(reqs, cap=1000, every=spare + 2), reqs, 2)
    reqs = _reqs(2)
    got = B.fill_batch(_FillEngine(reqs, cap=1000, every=spare + 2), reqs, 2, allowance=2 * spare)
    assert got == 2 * (spare + 2)
    # --fill-steps is bounded by the positions the context leaves
    assert B.fill_allowance(51072, 49152, 137, 100) == 100
    with pytest.raises(ValueError, match="leaves room for 102 more steps"):
        B.fill_allowance(51072, 49152, 137, 103)


def test_the_extra_waves_lengthen_the_output_caps():
    """--handoff-trace and --handoff-pipelined run after the timed waves: the caps cover their
    steps (an earlier wave's landing, the wave, the plain steps before the pipelined one), so
    the batch they measure is still whole."""

    def args(**kw):
        base = {"warmup": 8, "steps": 30, "host_profile": 0, "profile_steps": 5}
        return type("A", (), {**base, **kw})()

    plain = B.steps_per_row(args())
    assert B.steps_per_row(args(handoff_trace=True)) == plain + 2 * B.EXTRA_WAVE_STEPS
    assert (
        B.steps_per_row(args(handoff_pipelined=True))
        == plain + 2 * B.EXTRA_WAVE_STEPS + B.PIPELINED_PLAIN_STEPS + 1
    )
    # fig4_h200's 49K rows (model.max_context_len 51072) still fit with both, at batch 8
    both = B.steps_per_row(args(handoff_trace=True, handoff_pipelined=True))
    assert B.fill_allowance(51072, 49152, both, 0) == 0
