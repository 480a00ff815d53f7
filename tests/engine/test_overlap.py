"""Overlap scheduling: a plain step is launched before the previous one is read back.

The tokens must be those of synchronous steps (a finished request's extra step is dropped), and
a request aborted while its step is in flight must free everything."""

from __future__ import annotations

import pytest

from systems.engine.request import Request, SamplingParams
from tests.helpers import golden_prompts, make_engine

PLAIN = ["resident", "hisparse", "adaptive_hisparse"]


def _serve(overlap: bool, system: str, emulate: bool) -> tuple[list[list[int]], dict]:
    eng = make_engine(
        f"system={system}",
        "hardware.kv_pool_gib=0.01",
        f"engine.overlap_schedule={str(overlap).lower()}",
        *(["+engine.cuda_graph_emulate=true"] if emulate else []),
    )
    return [r.output_ids for r in _run_mixed(eng)], eng.metrics()


def _run_mixed(eng) -> list[Request]:
    """The golden prompts with different caps and stop tokens, run to the end: requests leave
    the batch at different steps, some by a stop token seen one step late under overlap."""
    params = [
        SamplingParams(max_new_tokens=9),
        SamplingParams(max_new_tokens=3),
        SamplingParams(max_new_tokens=12, stop_token_ids=frozenset({98}), ignore_eos=False),
        SamplingParams(max_new_tokens=1),
        SamplingParams(max_new_tokens=7, stop_token_ids=frozenset({429}), ignore_eos=False),
    ]
    reqs = [Request(eng.new_rid(), p, sp) for p, sp in zip(golden_prompts(), params)]
    for r in reqs:
        eng.submit(r)
    eng.run_until_idle()
    eng.backend.check_integrity()
    assert eng.backend.is_empty
    return reqs


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("system", PLAIN)
def test_overlap_on_and_off_give_the_same_tokens(system, emulate):
    sync, m_sync = _serve(False, system, emulate)
    over, m_over = _serve(True, system, emulate)
    assert over == sync
    assert m_sync["dhs_overlapped_steps_total"] == 0
    assert m_over["dhs_overlapped_steps_total"] > 0  # the overlap path really ran


SPEC = ["resident_dflash2", "adaptive_dhisparse"]


def _serve_spec(overlap: bool, system: str, emulate: bool, acceptance: str = "exact"):
    from tests.spec.test_speculative import _spec_engine

    eng = _spec_engine(
        system,
        "tiny",
        4,
        acceptance == "exact",  # the scripted drafter: rounds accept 0 to 3 drafts
        f"engine.overlap_schedule={str(overlap).lower()}",
        f"system.speculation.acceptance={acceptance}",
        *(["+engine.cuda_graph_emulate=true"] if emulate else []),
    )
    reqs = _run_mixed(eng)
    assert [len(r.output_ids) for r in reqs][1::2] == [3, 1]  # caps hold across a round
    return [r.output_ids for r in reqs], eng


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("system", SPEC)
def test_overlapped_rounds_give_the_tokens_of_synchronous_ones(system, emulate):
    """A round launched before the previous one is read back (its anchors and positions taken
    on the device, the previous round committed afterwards, two blocks in the tail ring)."""
    sync, e_sync = _serve_spec(False, system, emulate)
    over, e_over = _serve_spec(True, system, emulate)
    assert over == sync
    assert e_sync.stats["overlapped_steps_total"] == 0
    assert e_over.stats["overlapped_steps_total"] > 0
    assert e_over.backend.blocks_in_flight == 2 and e_sync.backend.blocks_in_flight == 1
    # the rounds really accepted several drafts at once (the scripted drafter)
    assert e_over.decoder.stats["spec_accepted_total"] > 0
    # the counters are the delivered rounds' in both modes: not the round a request that
    # finished meanwhile still ran under overlap, nor tokens past a cap or a stop token (every
    # token but a request's first, sampled at admission, comes from a round)
    for e, toks in ((e_sync, sync), (e_over, over)):
        assert e.decoder.stats["spec_emitted_total"] == sum(len(t) - 1 for t in toks)
    keys = ("spec_rounds_total", "spec_accepted_total", "spec_queries_total")
    assert [e_over.decoder.stats[k] for k in keys] == [e_sync.decoder.stats[k] for k in keys]


def test_overlapped_rounds_under_calibrated_acceptance_commit_every_token():
    """Calibrated draws follow the batch of each round, which overlap changes near the caps,
    so the tokens may differ from synchronous rounds; the commits must still match them."""
    toks, eng = _serve_spec(True, "adaptive_dhisparse", True, "calibrated")
    assert eng.stats["overlapped_steps_total"] > 0 and all(toks)
    # every request stopped at its cap or stop token (_serve_spec checks the caps of 3 and 1),
    # and each delivered token after the first came from a committed round
    assert eng.decoder.stats["spec_emitted_total"] == sum(len(t) - 1 for t in toks)
    assert eng.decoder.stats["spec_accepted_total"] > 0


def test_a_tail_ring_too_small_for_two_blocks_is_refused():
    with pytest.raises(ValueError, match="tail_rows"):
        make_engine(
            "system=adaptive_dhisparse",
            "system.speculation.window=64",
            "hardware.kv_pool_gib=0.05",
            "system.kv.tail_rows=6",
        )


@pytest.mark.parametrize("system", PLAIN)
def test_abort_while_its_step_is_in_flight_frees_everything(system):
    eng = make_engine(f"system={system}", "hardware.kv_pool_gib=0.01")
    p = golden_prompts()
    keep = Request(eng.new_rid(), p[0], SamplingParams(max_new_tokens=8))
    gone = Request(eng.new_rid(), p[1], SamplingParams(max_new_tokens=50))
    seen = []
    gone.on_output = lambda req, ids, done: seen.append(done)
    eng.submit(keep)
    eng.submit(gone)
    for _ in range(3):
        eng.step()
    assert eng._inflight is not None and id(gone) in eng._inflight.index
    eng.abort(gone)
    eng.run_until_idle()
    assert gone.finish_reason == {"type": "abort"} and seen[-1] is True
    assert len(keep.output_ids) == 8
    eng.backend.check_integrity()
    assert eng.backend.is_empty and eng.is_idle
