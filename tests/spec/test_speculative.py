"""Speculative decoding over resident and adaptive KV: exactness, acceptance law, ring, union."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from systems.engine.request import Request, SamplingParams
from systems.models.drafters import DFlash2Drafter
from systems.spec import acceptance
from systems.spec.ring import ring_address, ring_rows
from tests.helpers import make_engine, run_greedy

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "tiny_greedy.json").read_text())


class ScriptedDrafter(DFlash2Drafter):
    """Test drafter: proposes the golden continuation, corrupted at positions where
    (position * 7) % 5 == 0, so rounds accept anywhere from 0 to K-1 drafts."""

    graph_capturable = False  # reads the golden continuation on the host

    def propose(self, slots, anchors, n, K, temperatures, gen, sampled=None):
        props, _ = super().propose(slots, anchors, n, K, temperatures, gen, sampled)
        eng = self.engine
        for b, slot in enumerate(slots.tolist()):
            req = eng.scheduler.running[slot]
            i = GOLDEN["prompts"].index(req.prompt_ids)
            gold = GOLDEN["outputs"][self.model_name][i]
            T = len(req.prompt_ids)
            for j in range(K - 1):
                pos = int(n[b]) + j + 1
                k = pos - T
                if k < len(gold) and (pos * 7) % 5 != 0:
                    props[b, j] = gold[k]
        V = self.target.cfg.vocab_size
        q = torch.nn.functional.one_hot(props, V).float()
        return props, q


def _spec_engine(system, model, block, scripted=True, *extra):
    eng = make_engine(
        f"system={system}",
        f"model={model}",
        "hardware.kv_pool_gib=0.01",
        "system.speculation.window=64",
        f"system.speculation.block_size={block}",
        *extra,
    )
    if scripted:
        d = eng.decoder.drafter
        d.__class__ = ScriptedDrafter
        d.engine, d.model_name = eng, model
    return eng


@pytest.mark.parametrize("block", [4, 6, 8])
@pytest.mark.parametrize("system", ["resident_dflash2", "adaptive_dhisparse"])
@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
def test_greedy_speculation_reproduces_golden_tokens(system, model, block):
    extra = (
        ["system.kv.hot_cache_rows=8", "system.kv.verify_rows=true"] if "adaptive" in system else []
    )
    eng = _spec_engine(system, model, block, True, *extra)
    outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"][model]
    st_ = eng.decoder.stats
    assert st_["spec_accepted_total"] > st_["spec_rounds_total"] * 0.3  # real multi-token rounds
    eng.backend.check_integrity()
    assert eng.backend.is_empty


@pytest.mark.parametrize("system", ["resident_dflash2", "adaptive_dhisparse"])
def test_verification_through_the_graph_protocol_is_exact(system):
    """Verification passes (Q = K queries) through the emulated CUDA-graph runner: golden
    tokens, graphs keyed by the pass width, the verification staging path inside the region."""
    extra = ["system.kv.hot_cache_rows=8"] if "adaptive" in system else []
    eng = _spec_engine(
        system,
        "tiny",
        4,
        True,
        "+engine.cuda_graph_emulate=true",
        "engine.cuda_graph_scan_step=16",
        *extra,
    )
    outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"]["tiny"]
    r = eng.graph_runner
    assert r.stats["replays"] > 0 and {q for (_, q, _) in r.graphs} == {4}
    eng.backend.check_integrity()


@pytest.mark.parametrize("system", ["resident_dflash2", "adaptive_dhisparse_dspark"])
def test_real_drafters_through_drafter_graphs_are_exact(system):
    """A real drafter's propose and catch_up captured (emulated) like the target: no host
    sync inside, the same golden tokens, and the same proposals as the eager drafter (equal
    acceptance counts)."""
    extra = ["system.speculation.cost_per_query=0.5"] if "dspark" in system else []
    eager = _spec_engine(system, "tiny", 6, False, *extra)
    graph = _spec_engine(system, "tiny", 6, False, "+engine.cuda_graph_emulate=true", *extra)
    prompts = GOLDEN["prompts"][:3]
    outs = [run_greedy(e, prompts, GOLDEN["max_new_tokens"]) for e in (eager, graph)]
    assert outs[0] == outs[1] == GOLDEN["outputs"]["tiny"][:3]
    st = graph.graph_runner.drafter.stats
    assert st["captures"] >= 2 and st["replays"] > 0  # propose and catch_up keys
    assert {k[0] for k in graph.graph_runner.drafter.graphs} == {"propose", "catch_up"}
    assert eager.decoder.stats == graph.decoder.stats
    if "dspark" in system:  # per-request K_r reach the KV path through the target's graphs
        assert {k[3:] for k in graph.graph_runner.graphs} == {("widths",)}
        census = [
            {k: v for k, v in e.metrics().items() if k.startswith("dhs_selected_rows")}
            for e in (eager, graph)
        ]
        assert census[0] == census[1]


@pytest.mark.parametrize("system", ["resident_dspark", "adaptive_dhisparse_dspark"])
def test_dspark_with_real_drafter_is_exact_and_picks_prefixes(system):
    eng = _spec_engine(system, "tiny", 8, False, "system.speculation.cost_per_query=0.5")
    outs = run_greedy(eng, GOLDEN["prompts"][:3], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"]["tiny"][:3]
    st_ = eng.decoder.stats
    # with costly queries and random-drafter confidences, the scheduler verifies short prefixes
    assert st_["spec_queries_total"] < 8 * st_["spec_rounds_total"]


def test_dspark_chooses_prefixes_on_the_device_after_its_first_round(monkeypatch):
    """On the drafter's confidences DSpark's prefix choice stays on the device: once a round
    has been read back (its widest choice sets the next pass's width), launching a round reads
    no device value on the host; the tokens stay golden."""
    import systems.host_sync as hs

    eng = _spec_engine("resident_dspark", "tiny", 8, False, "system.speculation.cost_per_query=0.5")
    reqs = [
        Request(eng.new_rid(), p, SamplingParams(max_new_tokens=GOLDEN["max_new_tokens"]))
        for p in GOLDEN["prompts"][:3]
    ]
    for r in reqs:
        eng.submit(r)
    eng.step(), eng.step()  # admissions and the first rounds (the first reads its choice)
    assert eng.decoder.device_widths and eng.decoder._width is not None
    # the ops that read device data on the host (building tensors from host data is allowed)
    reads = {"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.is_nonzero"}
    monkeypatch.setattr(hs, "_SYNC_OPS", reads)
    with hs.no_host_sync():
        eng.step()  # launches a round, then reads and commits the previous one
    monkeypatch.undo()
    eng.run_until_idle()
    assert [r.output_ids for r in reqs] == GOLDEN["outputs"]["tiny"][:3]


def test_dspark_under_calibrated_acceptance_verifies_drafts():
    """Calibrated acceptance drives DSpark's prefix choice with the calibrated per-position
    acceptance: rounds verify drafts (K_r > 1) and emit about what the calibration promises,
    where the random drafter's own confidences would pick K_r = 1."""
    eng = _spec_engine(
        "resident_dspark", "tiny", 8, False, "system.speculation.acceptance=calibrated"
    )
    dec = eng.decoder
    props = torch.zeros((3, 7), dtype=torch.long)
    k_r = dec._k_r(None, props)
    a = dec.alpha
    exp = [sum(a**i for i in range(k)) / (dec.cost0 + dec.cost_per_query * k) for k in range(1, 9)]
    assert k_r.tolist() == [max(range(8), key=lambda i: exp[i]) + 1] * 3 and int(k_r[0]) > 1
    # the width every round will verify, which the start-up warm-up captures
    assert dec.verify_queries == int(k_r[0]) < dec.block
    run_greedy(eng, GOLDEN["prompts"][:2], 24)
    st_ = dec.stats
    assert st_["spec_queries_total"] > 1.5 * st_["spec_rounds_total"]
    assert st_["spec_accepted_total"] > 0
    drafter = _spec_engine(
        "resident_dspark",
        "tiny",
        8,
        False,
        "system.speculation.acceptance=calibrated",
        "system.speculation.scheduler_confidence=drafter",
    ).decoder
    assert not drafter.calibrated_confidence
    assert drafter.verify_queries == drafter.block  # varies per round: warmed at the block
    with pytest.raises(ValueError, match="scheduler_confidence"):
        _spec_engine(
            "resident_dspark", "tiny", 8, False, "system.speculation.scheduler_confidence=maybe"
        )


def _sampled_run(eng, temperature, monkeypatch=None, seen=None):
    """One request of 24 tokens at ``temperature``; with ``seen``, the drafter's eager
    proposals record whether they sampled."""
    from systems.engine.request import Request, SamplingParams

    if seen is not None:
        d = eng.decoder.drafter
        propose = d.propose

        def spy(slots, anchors, n, K, temps, gen, sampled):
            seen.append(sampled)
            return propose(slots, anchors, n, K, temps, gen, sampled)

        monkeypatch.setattr(d, "propose", spy)
    r = Request(eng.new_rid(), GOLDEN["prompts"][0], SamplingParams(24, temperature=temperature))
    eng.submit(r)
    eng.run_until_idle()
    assert len(r.output_ids) == 24
    return r.output_ids


@pytest.mark.parametrize(
    "system,mode,drafts_sampled",
    [
        ("resident_dflash2", "calibrated", True),  # a parallel drafter draws after its pass
        ("resident_dflash2", "exact", True),
        ("resident_dspark", "calibrated", False),  # sequential: greedy drafts keep the graph
        ("resident_dspark", "exact", True),  # exact acceptance needs drafts drawn from q
    ],
)
def test_sampled_requests_draw_their_drafts_where_the_rule_or_the_output_needs_it(
    system, mode, drafts_sampled, monkeypatch
):
    """A sampled request's drafts are drawn from q under exact acceptance (the rule needs it)
    and, where the drafter draws after its pass, under calibrated acceptance too (accepted
    drafts are output; greedy drafts of random weights cycle). Its output leaves the same
    engine's greedy output."""
    spec = f"system.speculation.acceptance={mode}"
    seen: list = []
    sampled = _sampled_run(_spec_engine(system, "tiny", 4, False, spec), 1.0, monkeypatch, seen)
    assert seen and set(seen) == {drafts_sampled}
    assert sampled != _sampled_run(_spec_engine(system, "tiny", 4, False, spec), 0.0)


def test_a_parallel_drafter_samples_after_its_graph_replay(monkeypatch):
    """With drafter graphs (emulated on CPU), a sampled request's DFlash2 drafts are drawn after
    the greedy pass's replay: the graph is used, the drafts leave the pass's greedy ones, and
    the output has more distinct tokens than the greedy one (tiny's greedy drafts repeat)."""
    from systems.spec import decoder as D

    pairs, redraw = [], D.redraw

    def spy(greedy, q, temps, gen):
        drawn = redraw(greedy, q, temps, gen)
        pairs.append((greedy.clone(), drawn))
        return drawn

    monkeypatch.setattr(D, "redraw", spy)
    extra = ("system.speculation.acceptance=calibrated", "+engine.cuda_graph_emulate=true")
    eng = _spec_engine("resident_dflash2", "tiny", 4, False, *extra)
    sampled = _sampled_run(eng, 1.0)
    assert eng.graph_runner.drafter.stats["replays"] > 0
    assert pairs and any(not torch.equal(g, d) for g, d in pairs)
    greedy = _sampled_run(_spec_engine("resident_dflash2", "tiny", 4, False, *extra), 0.0)
    assert len(set(sampled)) > len(set(greedy))


def test_union_resolution_copies_each_distinct_miss_once():
    # B == k and a block of 8 queries: the union of selections overflows the hot cache, so the
    # staging arena is used; every distinct missing row is copied once per call
    eng = _spec_engine(
        "adaptive_dhisparse",
        "tiny",
        8,
        True,
        "system.kv.hot_cache_rows=8",
        "system.kv.optional_residency=false",
        "system.kv.verify_rows=true",
    )
    outs = run_greedy(eng, GOLDEN["prompts"][3:], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"]["tiny"][3:]
    m = eng.metrics()
    assert m["dhs_staged_rows_total"] > 0
    assert m["dhs_host_rows_copied_total"] < m["dhs_selected_rows_from_host_total"]


def test_kv_after_rejection_equals_non_speculative_kv():
    """Committed target rows after speculative rounds with rejections equal the rows a
    non-speculative run wrote for the same tokens. Verification projects K tokens in one matrix
    product where plain decoding projects one, and a CPU BLAS may pick another kernel for
    another row count (AVX-512 / AMX machines round the odd element differently), so the rows
    match to float rounding, and nearly all of their bytes exactly: a row left behind by a
    rejected draft holds another token's projection and differs in every element."""
    p = GOLDEN["prompts"][2]
    ref = make_engine("hardware.kv_pool_gib=0.01")
    spec = _spec_engine("resident_dflash2", "tiny", 4)
    rows = []
    for eng in (ref, spec):
        from systems.engine.request import Request, SamplingParams

        r = Request(eng.new_rid(), p, SamplingParams(max_new_tokens=20))
        eng.submit(r)
        while len(r.output_ids) < 15:
            eng.step()
        be = eng.backend
        n = len(p) + 10
        loc = be._token_locs(
            be.req_to_index_page, torch.tensor([r.slot]), torch.arange(n).unsqueeze(0)
        )[0]
        rows.append(be.kv_pool[:, loc].clone())
    assert spec.decoder.stats["spec_accepted_total"] < 3 * spec.decoder.stats["spec_rounds_total"]
    a, b = (x.view(torch.bfloat16).float() for x in rows)  # tiny's rows are bf16
    assert torch.isclose(a, b, rtol=2**-7, atol=1e-6).all()  # one bf16 rounding step
    assert (rows[0] != rows[1]).float().mean().item() < 0.01
    # the tolerance tells tokens apart: no row is within it of its neighbour's (another token)
    assert not torch.isclose(a[:, 1:], a[:, :-1], rtol=2**-7, atol=1e-6).all(-1).any()


def test_ring_size_matches_the_paper():
    assert ring_rows(2048, 64, 8) == 2176  # eq. 9 with the paper's W, p, K_max


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 64),
    st.integers(1, 8),
    st.integers(0, 5000),
    st.integers(0, 7),
)
def test_ring_never_aliases_two_live_positions(window, page, k_max, t0, slot):
    r_d = ring_rows(window, page, k_max)
    live = range(max(0, t0 - window), t0 + k_max)  # window + current block
    rows = [ring_address(slot, t, r_d) for t in live]
    assert len(set(rows)) == len(rows)
    assert all(slot * r_d <= x < (slot + 1) * r_d for x in rows)


# ---------------------------------------------------------------------------------------------
# the acceptance law: sampled speculative output follows the target distribution
V = 4


def _toy(prev):
    """Prefix-dependent target p and draft q over 4 tokens (rows indexed by the previous token)."""
    P = torch.tensor(
        [
            [0.5, 0.2, 0.2, 0.1],
            [0.1, 0.6, 0.2, 0.1],
            [0.25, 0.25, 0.25, 0.25],
            [0.05, 0.05, 0.1, 0.8],
        ]
    )
    Qd = torch.tensor(
        [[0.25, 0.25, 0.25, 0.25], [0.4, 0.3, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]]
    )
    return P[prev], Qd[prev]


def _simulate(rule, N=30000, K=3, seed=0):
    """First two emitted tokens of N independent sequences starting after token 0."""
    g = torch.Generator().manual_seed(seed)
    prev = torch.zeros(N, dtype=torch.long)
    out = [[] for _ in range(N)]
    active = list(range(N))
    while active:
        idx = torch.tensor(active)
        pv = prev[idx]
        B = len(active)
        props = torch.zeros(B, K - 1, dtype=torch.long)
        qs = torch.zeros(B, K - 1, V)
        logits = torch.zeros(B, K, V)
        cur = pv.clone()
        for j in range(K - 1):
            p_j, q_j = _toy(cur)
            qs[:, j] = q_j
            logits[:, j] = p_j.log()
            props[:, j] = torch.multinomial(q_j, 1, generator=g)[:, 0]
            cur = props[:, j]
        logits[:, K - 1] = _toy(cur)[0].log()
        A, nxt = rule(logits, props, qs, torch.full((B,), K), torch.ones(B), g)
        keep = []
        for b, i in enumerate(active):
            toks = props[b, : A[b]].tolist() + [nxt[b]]
            out[i].extend(toks)
            prev[i] = out[i][-1]
            if len(out[i]) < 2:
                keep.append(i)
        active = keep
    return torch.tensor([o[:2] for o in out])


CHI2_15DF_P001 = 37.697  # chi-square critical value, 15 degrees of freedom, p = 0.001


def _chi2_ok(seqs):
    """Joint law of the first two emitted tokens against p(a | 0) p(b | a)."""
    p0 = _toy(torch.tensor(0))[0].double()
    expect = torch.stack([p0[a] * _toy(torch.tensor(a))[0].double() for a in range(V)])
    expect = expect.reshape(-1) * len(seqs)
    counts = torch.bincount(seqs[:, 0] * V + seqs[:, 1], minlength=V * V).double()
    return float(((counts - expect) ** 2 / expect).sum()) < CHI2_15DF_P001


def _resample_from_target(logits, props, q, k_r, temps, gen):
    """Negative control: on rejection draw from p instead of the residual max(0, p - q)."""
    A, nxt = [], []
    p = torch.softmax(logits, -1)
    for b in range(logits.shape[0]):
        a, tok = 0, None
        while a < int(k_r[b]) - 1:
            x = int(props[b, a])
            if torch.rand((), generator=gen) < min(1.0, float(p[b, a, x] / q[b, a, x])):
                a += 1
                continue
            tok = int(torch.multinomial(p[b, a], 1, generator=gen))
            break
        A.append(a)
        nxt.append(tok if tok is not None else int(torch.multinomial(p[b, a], 1, generator=gen)))
    return A, nxt


def _wrong_q(logits, props, q, k_r, temps, gen):
    """Negative control: acceptance computed with a q other than the one drafts came from."""
    return acceptance.accept_exact(logits, props, torch.full_like(q, 1.0 / V), k_r, temps, gen)


def test_sampled_speculation_follows_the_target_distribution():
    assert _chi2_ok(_simulate(acceptance.accept_exact))


@pytest.mark.parametrize("control", [_resample_from_target, _wrong_q])
def test_the_distribution_test_rejects_broken_rules(control):
    assert not _chi2_ok(_simulate(control, seed=1))


def test_calibrated_alpha_matches_the_target_mean():
    a = acceptance.calibrated_alpha(4, 2.88)
    assert abs((1 - a**4) / (1 - a) - 2.88) < 1e-6
    logits = torch.randn(20000, 4, 8)
    A, _ = acceptance.accept_calibrated(
        logits, torch.full((20000,), 4), a, torch.Generator().manual_seed(0)
    )
    assert abs(A.float().mean().item() + 1 - 2.88) < 0.03


def test_calibrated_next_token_is_the_targets_at_the_first_unaccepted_position():
    """Greedy: the argmax there. Sampled: a draw from softmax(logits / T) there, so a sampled
    request's output follows its temperature (a chi-square check on one peaked row), while a
    greedy row in the same batch keeps its argmax."""
    g = torch.Generator().manual_seed(5)
    B, K, Vs = 4000, 4, 5
    logits = torch.randn(B, K, Vs, generator=g)
    k_r = torch.full((B,), K)
    A, nxt = acceptance.accept_calibrated(logits, k_r, 0.5, torch.Generator().manual_seed(0))
    at = logits[torch.arange(B), A]
    assert torch.equal(nxt, at.argmax(-1))
    row = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    same = row.expand(B, K, Vs).clone()
    temps = torch.full((B,), 0.7)
    temps[0] = 0.0
    A, nxt = acceptance.accept_calibrated(
        same, k_r, 0.5, torch.Generator().manual_seed(1), temps, True
    )
    assert nxt[0].item() == 0  # the greedy row
    p = torch.softmax(row / 0.7, -1)
    counts = torch.bincount(nxt[1:], minlength=Vs).double()
    expect = p.double() * (B - 1)
    chi2 = (((counts - expect) ** 2) / expect).sum().item()
    assert chi2 < 18.5  # 4 degrees of freedom, p = 0.001
    assert counts[1:].sum() > 0.2 * (B - 1)  # not the argmax alone (p = 0.29)


def test_device_greedy_acceptance_equals_the_host_rule():
    """accept_greedy (device tensors, no host loop) against accept_exact's greedy branch, on
    random drafts that often match the argmax, with per-request verification widths."""
    g = torch.Generator().manual_seed(3)
    B, K, Vs = 64, 6, 3  # a small vocabulary: drafts match the argmax often
    logits = torch.randn(B, K, Vs, generator=g)
    props = torch.randint(0, Vs, (B, K - 1), generator=g)
    k_r = torch.randint(1, K + 1, (B,), generator=g)
    want_a, want_n = acceptance.accept_exact(
        logits, props, torch.full((B, K - 1, Vs), 1.0 / Vs), k_r, torch.zeros(B), None
    )
    got_a, got_n = acceptance.accept_greedy(logits, props, k_r)
    assert got_a.tolist() == want_a and got_n.tolist() == want_n
    assert 0 < sum(want_a) < B * (K - 1)  # both partial and full acceptance occur


def test_dspark_cost_model_is_profiled_online():
    eng = _spec_engine("resident_dspark", "tiny", 8, False)
    dec = eng.decoder
    assert dec._cost_model() == (dec.cost0, dec.cost_per_query)  # nothing measured yet
    dec._round_ms = {2: 10.0, 4: 14.0, 8: 22.0}  # 6 ms + 2 ms per query
    a, b = dec._cost_model()
    assert a == 1.0 and abs(b - 2.0 / 6.0) < 1e-9
    run_greedy(eng, GOLDEN["prompts"][:2], 12)
    assert dec._round_ms and all(v > 0 for v in dec._round_ms.values())


def test_phase_timer_splits_each_round_into_its_phases():
    """bench_decode_step --phases: one time per phase per round, adding up to the round."""
    import time

    from systems.spec.decoder import PhaseTimer

    eng = _spec_engine("resident_dflash2", "tiny", 4, False)
    timer = eng.decoder.phase_timer = PhaseTimer(eng.device)
    from systems.engine.request import Request, SamplingParams

    reqs = [
        Request(eng.new_rid(), p, SamplingParams(max_new_tokens=8)) for p in GOLDEN["prompts"][:2]
    ]
    for r in reqs:
        eng.submit(r)
    eng.step()  # admissions + the first round
    t0 = time.perf_counter()
    eng.step()
    wall_ms = (time.perf_counter() - t0) * 1e3
    ms = timer.ms()
    assert set(ms) == set(PhaseTimer.PHASES)
    n = len(timer.rounds)
    assert n == 2 and all(len(v) == n for v in ms.values())
    assert all(x >= 0 for v in ms.values() for x in v)
    last = sum(v[-1] for v in ms.values())
    assert 0 < last <= wall_ms
    assert ms["verify"][-1] > 0 and ms["propose"][-1] > 0


def test_an_arrival_writes_its_prompts_ring_once_computed_whatever_arrives_with_it():
    """An arrival's drafter ring rows are its prompt's tail attending to itself alone, computed
    at the prompt's first admission and kept in the prefill entry: the same bytes whether the
    wave's arrivals come together or one by one, a later request of the prompt reuses them,
    and a prompt within the window matches a catch-up from position 0 (whose window holds
    nothing), to float rounding (another attention kernel)."""
    import types

    prompts = [GOLDEN["prompts"][i] for i in range(3)]
    prompts.append(list(range(2, 90)))  # longer than the window: its last 64 positions
    rings, engines = [], []
    for batched in (True, False):
        eng = _spec_engine("resident_dflash2", "tiny", 4, False)
        arrivals = []
        for slot, p in enumerate(prompts):
            entry, _ = eng.prefixes.get(p)
            req = types.SimpleNamespace(slot=slot, prompt_ids=p, num_prompt_tokens=len(p))
            arrivals.append((req, entry))
        eng.decoder.on_admit([])  # nothing arrived: nothing to do
        if batched:
            eng.decoder.on_admit(arrivals)
        else:
            for a in arrivals:
                eng.decoder.on_admit([a])
        rings.append(eng.decoder.drafter.ring.kv.clone())
        engines.append((eng, arrivals))
    assert {len(e.tail_hidden) for _, e in arrivals} == {len(p) for p in prompts[:3]} | {64}
    assert torch.equal(rings[0], rings[1]) and rings[0].abs().sum() > 0

    eng, arrivals = engines[0]
    d = eng.decoder.drafter
    kept = [e.derived["draft_ring"] for _, e in arrivals]
    calls = []
    d.prompt_kv = lambda *a: calls.append(a)  # a second request of a prompt: nothing computed
    req, entry = arrivals[0]
    eng.decoder.on_admit([(types.SimpleNamespace(**{**vars(req), "slot": 3}), entry)])
    assert calls == [] and entry.derived["draft_ring"] is kept[0]
    slot3 = d.ring.rows(torch.tensor([3]), torch.arange(len(prompts[0]))[None])[0]
    slot0 = d.ring.rows(torch.tensor([0]), torch.arange(len(prompts[0]))[None])[0]
    assert torch.equal(d.ring.kv[:, :, slot3], d.ring.kv[:, :, slot0])

    p = prompts[1]  # within the window: a catch-up from position 0 sees no ring history
    ref = _spec_engine("resident_dflash2", "tiny", 4, False)
    entry, _ = ref.prefixes.get(p)
    L = len(p)
    ref.decoder.drafter.catch_up(
        torch.tensor([1]),
        torch.tensor([p]),
        torch.arange(L)[None],
        entry.tail_hidden[None],
        torch.ones(1, L, dtype=torch.bool),
    )
    rows = d.ring.rows(torch.tensor([1]), torch.arange(L)[None])[0]
    torch.testing.assert_close(
        ref.decoder.drafter.ring.kv[:, :, rows], d.ring.kv[:, :, rows], rtol=1e-5, atol=1e-6
    )


def test_one_value_for_the_batch_is_a_cached_device_tensor():
    """A round whose requests all verify one width (DFlash2's block, calibrated DSpark) or
    share one temperature reuses one device tensor of it per batch size, where a copy per round
    was host work; mixed values (DSpark's own confidences, mixed temperatures) are copied as
    they are."""
    from systems.host_sync import UniformValues

    dec = _spec_engine(
        "resident_dspark", "tiny", 8, False, "system.speculation.acceptance=calibrated"
    ).decoder
    k_r = dec._k_r(None, torch.zeros((5, 7), dtype=torch.long))
    assert k_r.shape == (5,) and len(set(k_r.tolist())) == 1
    widths = UniformValues(torch.device("cpu"), torch.int64)
    first = widths(k_r.tolist())
    assert widths(k_r.clone().tolist()) is first and first.tolist() == k_r.tolist()
    assert widths(k_r[:3].tolist()) is not first  # another batch size, another tensor
    got = widths([1, 4, 2])
    assert got.tolist() == [1, 4, 2] and got.dtype == torch.int64
    temps = UniformValues(torch.device("cpu"), torch.float32)
    assert temps([1.0] * 4) is temps(x for x in [1.0] * 4)
    assert temps([0.0, 1.0]).tolist() == [0.0, 1.0]
    widths.MAX_ENTRIES = 2  # the cache stays bounded: past it, it starts over
    widths([7] * 9), widths([7] * 10)
    assert len(widths._cache) <= 2


def _round_counters(eng, reqs, queries, widths):
    """Run one verification pass of ``queries`` queries for ``reqs`` (widths: the queries each
    verifies, or None) and return (its logits, the census it added)."""
    be = eng.backend
    keys = (
        "dhs_selected_rows_direct_total",
        "dhs_selected_rows_hot_total",
        "dhs_selected_rows_from_host_total",
        "dhs_host_rows_copied_total",
        "dhs_staged_rows_total",
    )
    before = eng.metrics()
    n = torch.tensor([r.seq_len for r in reqs])
    positions = n.unsqueeze(1) + torch.arange(queries)
    V = eng.model.cfg.vocab_size  # queries of other tokens select other rows
    tokens = torch.tensor([[(r.output_ids[-1] + 37 * j) % V for j in range(queries)] for r in reqs])
    w = None if widths is None else torch.tensor(widths)
    logits, _ = eng.run_target(
        [r.slot for r in reqs], tokens, positions, int(positions.max()) + 1, w
    )
    after = eng.metrics()
    be.check_integrity()
    return logits.clone(), {k: after[k] - before[k] for k in keys}


def test_queries_past_a_requests_prefix_add_nothing_to_its_union():
    """Eq. 6: a round resolves the union of each request's own K_r queries. A pass that runs
    the batch's widest prefix (8 queries) with widths (3, 8) selects, fetches, stages and
    counts exactly what request 0 alone at 3 queries and request 1 alone at 8 do; without the
    widths it fetches more (the test can tell)."""

    def engine():
        eng = _spec_engine(
            "adaptive_dhisparse",
            "tiny",
            8,
            False,
            "system.kv.hot_cache_rows=8",
            "system.kv.optional_residency=false",
            "engine.overlap_schedule=false",
        )
        reqs = [
            Request(eng.new_rid(), p, SamplingParams(max_new_tokens=40))
            for p in GOLDEN["prompts"][3:]
        ]
        for r in reqs:
            eng.submit(r)
        while any(not r.output_ids for r in reqs) or any(r.slot is None for r in reqs):
            eng.step()
        eng.step()  # a round with both running: their hot caches hold rows
        return eng, reqs

    eng, reqs = engine()
    both_logits, both = _round_counters(eng, reqs, 8, [3, 8])
    eng, reqs = engine()
    alone0_logits, alone0 = _round_counters(eng, reqs[:1], 3, None)
    alone1_logits, alone1 = _round_counters(eng, reqs[1:], 8, None)
    assert both == {k: alone0[k] + alone1[k] for k in both}
    assert both["dhs_selected_rows_from_host_total"] > 0  # the rounds fetch from host
    torch.testing.assert_close(both_logits[0, :3], alone0_logits[0])
    torch.testing.assert_close(both_logits[1], alone1_logits[0])
    eng, reqs = engine()
    _, unmasked = _round_counters(eng, reqs, 8, None)
    assert unmasked["dhs_host_rows_copied_total"] > both["dhs_host_rows_copied_total"]
