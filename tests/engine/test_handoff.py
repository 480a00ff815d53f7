"""Asynchronous handoffs: an admitted request waits in ``arriving`` until its history's copies
are done, the running batch decodes meanwhile, and nothing else changes.

On a GPU the copies run on the backend's handoff stream and a CUDA event says when they are done
(benchmarks/check_cuda_graph.py compares the tokens there). Here a stand-in event stays
pending for a number of polls, so the engine meets a handoff still in flight: the request must
not decode before it arrives, must produce the tokens it produces with synchronous handoffs, and
an abort while its copies run must wait for them and free everything."""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from systems.engine.request import ReqStatus, Request, SamplingParams
from tests.helpers import SlowCopy, golden_prompts, make_engine

SYSTEMS = ["resident", "hisparse", "adaptive_hisparse", "adaptive_dhisparse"]


def slow_handoffs(eng, polls: int) -> list[SlowCopy]:
    """Every asynchronous handoff of ``eng`` stays in flight for ``polls`` polls."""
    be, orig, made = eng.backend, eng.backend.admit, []

    def admit(prefix, max_new_tokens, asynchronous=False):
        slot = orig(prefix, max_new_tokens, asynchronous=asynchronous)
        if asynchronous:
            made.append(SlowCopy(polls))
            be.importing[slot] = made[-1]
        return slot

    be.admit = admit
    return made


def _engine(system: str, *extra: str):
    spec = ["system.speculation.window=64"] if "dhisparse" in system else []
    return make_engine(f"system={system}", "hardware.kv_pool_gib=0.05", *spec, *extra)


def _serve(eng, caps: list[int]) -> list[list[int]]:
    reqs = [
        Request(eng.new_rid(), p, SamplingParams(max_new_tokens=n))
        for p, n in zip(golden_prompts(), caps)
    ]
    for r in reqs:
        eng.submit(r)
    eng.run_until_idle()
    eng.backend.check_integrity()
    assert eng.backend.is_empty and not eng.backend.importing
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("system", SYSTEMS)
def test_slow_handoffs_give_the_tokens_of_synchronous_ones(system):
    caps = [9, 3, 12, 1, 7]
    sync = _serve(_engine(system, "engine.async_handoffs=false"), caps)
    # two admissions per round: later requests arrive while earlier ones decode
    eng = _engine(system, "engine.max_handoffs_per_step=2")
    copies = slow_handoffs(eng, polls=3)
    assert _serve(eng, caps) == sync
    assert len(copies) == len(caps) and all(c.left < 0 for c in copies)


def test_a_request_decodes_only_after_its_history_arrived():
    eng = _engine("hisparse")
    p = golden_prompts()
    first = Request(eng.new_rid(), p[0], SamplingParams(max_new_tokens=20))
    eng.submit(first)
    eng.step()
    assert first.status == ReqStatus.RUNNING  # synchronous on CPU: arrived at once
    slow_handoffs(eng, polls=4)
    late = Request(eng.new_rid(), p[1], SamplingParams(max_new_tokens=4))
    eng.submit(late)
    steps_before = eng.stats["num_steps"]
    eng.step()
    assert late.status == ReqStatus.HANDOFF and late.slot in eng.scheduler.arriving
    assert eng.metrics()["dhs_num_handoff_reqs"] == 1
    while late.status == ReqStatus.HANDOFF:
        assert not late.output_ids  # not even its first token before the history is there
        eng.step()
    # the running request kept decoding while the copies ran
    assert eng.stats["num_steps"] - steps_before >= 4
    assert len(late.output_ids) == 1 and late.timing()["handoff_s"] > 0
    eng.run_until_idle()
    assert len(late.output_ids) == 4 and len(first.output_ids) == 20


def test_with_nothing_to_decode_the_engine_waits_for_the_oldest_handoff():
    eng = _engine("hisparse")
    copies = slow_handoffs(eng, polls=1000)
    req = Request(eng.new_rid(), golden_prompts()[0], SamplingParams(max_new_tokens=2))
    eng.submit(req)
    eng.step()
    assert copies[0].waited and req.status == ReqStatus.RUNNING


@pytest.mark.parametrize("system", SYSTEMS)
def test_abort_while_its_handoff_is_in_flight_waits_for_the_copies_and_frees_everything(system):
    eng = _engine(system)
    p = golden_prompts()
    keep = Request(eng.new_rid(), p[0], SamplingParams(max_new_tokens=6))
    eng.submit(keep)
    eng.step()
    copies = slow_handoffs(eng, polls=1000)
    gone = Request(eng.new_rid(), p[1], SamplingParams(max_new_tokens=50))
    seen = []
    gone.on_output = lambda req, ids, done: seen.append((ids, done))
    eng.submit(gone)
    eng.step()
    assert gone.status == ReqStatus.HANDOFF
    eng.abort(gone)
    eng.run_until_idle()
    assert copies[0].waited  # the slot's memory was released only after its copies
    assert gone.finish_reason == {"type": "abort"} and seen == [([], True)]
    assert len(keep.output_ids) == 6
    eng.backend.check_integrity()
    assert eng.backend.is_empty and eng.is_idle and not eng.backend.importing


def test_adaptive_never_reclaims_or_populates_a_slot_whose_history_is_on_its_way():
    eng = _engine("adaptive_hisparse")
    be = eng.backend
    slow_handoffs(eng, polls=1000)
    req = Request(eng.new_rid(), golden_prompts()[-1], SamplingParams(max_new_tokens=4))
    eng.submit(req)
    eng._intake()
    spare = be._spare
    be._spare = lambda: 0  # keep no page at admission: all of its history is to populate
    eng.scheduler.admit()
    be._spare = spare
    slot = req.slot
    assert req.status == ReqStatus.HANDOFF and slot in be.importing
    r = be.res[slot]
    assert r.num_complete > 0 and r.num_pages == 0 and be._spare() > 0
    be._populate()  # the step hook that fills optional pages from their host copies
    assert r.num_pages == 0  # its host copies are still being written
    assert slot not in be._ordered()  # and it is never a reclaim victim meanwhile
    assert be.import_done(slot, wait=True)
    be._populate()
    assert r.num_pages > 0 and slot in be._ordered()  # arrived: both apply again


def test_admission_phases_split_the_admission_time():
    """/metrics counts the engine thread's admission seconds by phase: every phase a handoff
    goes through is counted."""
    eng = _engine("adaptive_dhisparse")
    reqs = [Request(eng.new_rid(), p, SamplingParams(max_new_tokens=3)) for p in golden_prompts()]
    for r in reqs:
        eng.submit(r)
    eng.run_until_idle()
    m = eng.metrics()
    phases = {
        k.split('"')[1]: v for k, v in m.items() if k.startswith("dhs_admit_phase_seconds_total")
    }
    assert set(phases) == {"prefix", "can_admit", "handoff", "arrivals", "decoder", "first_token"}
    for phase in ("prefix", "handoff", "decoder", "first_token"):
        assert phases[phase] > 0, phase
    # the engine thread's CPU seconds of each phase (wall minus CPU: time it was blocked)
    cpu = {
        k.split('"')[1]: v
        for k, v in m.items()
        if k.startswith("dhs_admit_phase_cpu_seconds_total")
    }
    assert set(cpu) == set(phases)
    assert all(0 <= cpu[p] <= phases[p] + 0.05 for p in phases), (cpu, phases)
    assert cpu["handoff"] > 0
    # the backend's split of "handoff": its two halves, both timed inside it
    halves = {
        k.split('"')[1]: v for k, v in m.items() if k.startswith("dhs_handoff_phase_seconds_total")
    }
    assert set(halves) == {"reserve", "import"} and all(v > 0 for v in halves.values())
    assert sum(halves.values()) <= phases["handoff"]


def test_cuda_allocator_counters_name_the_allocations_that_can_stall(monkeypatch):
    """/metrics's allocator counts, from torch's counters (stubbed: no GPU here)."""
    from systems.engine.engine import cuda_allocator_counters

    dev = {"num_device_alloc": 7, "num_device_free": 2, "num_alloc_retries": 1}
    host = {"num_host_alloc": 5, "num_host_free": 0, "host_alloc_time.total": 2_500_000}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dev)
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: host)
    assert cuda_allocator_counters("cuda") == {
        "dhs_cuda_malloc_total": 7.0,
        "dhs_cuda_free_total": 2.0,
        "dhs_cuda_alloc_retries_total": 1.0,
        "dhs_cuda_host_alloc_total": 5.0,
        "dhs_cuda_host_free_total": 0.0,
        "dhs_cuda_host_alloc_seconds_total": 2.5,
    }


class _ElementWrites(TorchDispatchMode):
    """Records ``t[i] = python_number`` writes: a copy of a 0-dim host tensor into one element.
    On a GPU that copy comes from pageable memory and waits for everything queued on the stream
    (a decode step in flight), so admission and release must write such elements with a fill
    kernel. The CPU reference resolver reads and writes host values on purpose
    (``allow_host_sync``): it is not counted."""

    def __init__(self):
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from systems import host_sync

        if func.overloadpacket.__name__ == "copy_" and host_sync._allow_depth == 0:
            dst, src = args[0], args[1]
            if dst.dim() == 0 and src.dim() == 0 and src.device.type == "cpu":
                here = [f for f in traceback.extract_stack() if "/systems/" in f.filename]
                self.sites.append(f"{here[-1].filename}:{here[-1].lineno}" if here else "?")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("system", [*SYSTEMS, "resident_dspark", "adaptive_dhisparse_dspark"])
def test_admission_steps_and_release_never_write_an_element_from_the_host(system):
    eng = _engine(system)
    spy = _ElementWrites()
    with spy:
        _serve(eng, [4, 3, 5, 2, 4])
    assert not spy.sites, sorted(set(spy.sites))


def test_decode_stream_priority_moves_the_thread_and_back(monkeypatch):
    """engine.decode_stream_priority: a negative priority puts the calling thread on a shared
    stream of that priority (after a synchronize, so work queued before is done); a later
    engine asking for none puts a thread an engine moved back on the default stream, and
    leaves a thread no engine moved alone. Fake CUDA calls stand in for a GPU."""
    import torch

    from systems import cuda_streams
    from systems.engine import engine as E

    class FakeStream:
        def __init__(self, device=None, priority=0):
            self.priority = priority

    default = FakeStream()
    state = {"cur": default, "syncs": 0, "sets": []}

    def set_stream(s):
        state["cur"] = s
        state["sets"].append(s)

    monkeypatch.setattr(cuda_streams, "_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: state["cur"])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: default)
    monkeypatch.setattr(torch.cuda, "set_stream", set_stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "synchronize",
        lambda device=None: state.__setitem__("syncs", state["syncs"] + 1),
    )
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    dev = torch.device("cuda", 0)

    with pytest.raises(ValueError, match="decode_stream_priority: 0 or negative"):
        E.use_decode_stream(torch.device("cpu"), 1)
    assert E.use_decode_stream(torch.device("cpu"), -1) is None  # nothing to do on a CPU
    assert E.use_decode_stream(dev, 0) is None and state["sets"] == []  # left alone
    s = E.use_decode_stream(dev, -1)
    assert state["cur"] is s and s.priority == -1 and state["syncs"] == 1
    assert E.use_decode_stream(dev, -1) is s and state["syncs"] == 1  # shared, no new switch
    assert E.use_decode_stream(dev, 0) is None
    assert state["cur"] is default and state["syncs"] == 2  # moved back by the next engine


def test_decode_stream_priority_is_a_no_op_on_cpu():
    eng = make_engine("system=hisparse", "engine.decode_stream_priority=-1")
    assert eng.decode_stream is None
    base = make_engine("system=hisparse")
    outs = []
    for e in (eng, base):
        reqs = [Request(e.new_rid(), p, SamplingParams(max_new_tokens=4)) for p in golden_prompts()]
        for r in reqs:
            e.submit(r)
        e.run_until_idle()
        outs.append([r.output_ids for r in reqs])
    assert outs[0] == outs[1]
