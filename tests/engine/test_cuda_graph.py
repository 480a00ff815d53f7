"""The CUDA-graph runner's contract, checked on CPU through its emulation."""

import pytest
import torch

from systems.host_sync import HostSyncInCapture, allow_host_sync, no_host_sync
from tests.helpers import make_engine, run_greedy


def test_guard_rejects_host_syncs_and_allows_marked_ones():
    x = torch.arange(4)
    with no_host_sync():
        y = x * 2  # device work is fine
        with pytest.raises(HostSyncInCapture):
            int(y.sum())
        with pytest.raises(HostSyncInCapture):
            torch.tensor([1, 2])  # a host-built tensor would be baked into a graph
        with pytest.raises(HostSyncInCapture):
            y.nonzero()
        with allow_host_sync():
            assert int(y.sum()) == 12


def test_a_backend_that_syncs_in_device_prepare_is_caught():
    eng = make_engine("+engine.cuda_graph_emulate=true")
    be = eng.backend
    orig = be.device_prepare

    def leaky(slots, positions, max_len=None):
        orig(slots, positions, max_len)
        be._step["n"] = int(positions.max())  # the kind of bug a real capture bakes in

    be.device_prepare = leaky
    outs = run_greedy(eng, [[5, 6, 7]], 3)
    assert eng.stats["failed_total"] == 1 and outs == [[outs[0][0]]]  # first token only


def test_graphs_are_keyed_by_batch_queries_and_scan_bucket_and_evicted_lru():
    eng = make_engine(
        "+engine.cuda_graph_emulate=true",
        "engine.cuda_graph_scan_step=16",
        "+engine.cuda_graph_max_graphs=2",
        "engine.cuda_graph_capture_after=1",
    )
    run_greedy(eng, [[5] * 10, [6] * 20], 30)  # scans 21..50: buckets 32, 48, 64
    r = eng.graph_runner
    assert len(r.graphs) == 2 and r.stats["evictions"] >= 1
    assert all(L % 16 == 0 for (_, q, L) in r.graphs) and all(q == 1 for (_, q, _) in r.graphs)
    assert r.scan_len(17) == 32 and r.scan_len(16) == 16
    assert r.scan_len(10**9) == eng.backend.max_scan_len


def test_a_key_is_captured_at_its_capture_after_th_use_and_replayed_after(caplog):
    """Uses before ``capture_after`` run eagerly (same results, nothing recorded); the
    capture_after-th use captures, and the log names the key; later uses replay. Passing keys
    are forgotten LRU-first."""
    from systems.engine.cuda_graph import GraphCache

    c = GraphCache(torch.device("cpu"), emulate=True, capture_after=3, max_graphs=1)
    fn = lambda x: (x * 2,)  # noqa: E731
    with caplog.at_level("INFO", logger="dhs.cuda_graph"):
        outs = [c.run(("b", 4), fn, torch.full((2,), float(i)))[0].tolist() for i in range(5)]
    captured = [r.getMessage() for r in caplog.records if "captured on its use" in r.getMessage()]
    assert len(captured) == 1 and "graph ('b', 4) captured on its use 3" in captured[0]
    assert outs == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0], [6.0, 6.0], [8.0, 8.0]]
    assert c.stats == {
        "captures": 1,
        "replays": 2,
        "padded_replays": 0,
        "evictions": 0,
        "eager_steps": 2,
    }
    for i in range(6):  # six sizes met once each: eager, and remembered at most 4 x max_graphs
        c.run(("pass", i), fn, torch.ones(1))
    assert c.stats["captures"] == 1 and len(c._seen) == 4
    with pytest.raises(ValueError, match="capture_after"):
        GraphCache(torch.device("cpu"), emulate=True, capture_after=0)


def test_warm_up_graphs_come_on_top_of_the_bound_on_graphs_captured_while_serving():
    """A warm-up larger than max_graphs keeps every graph it captured; the bound then limits
    what serving adds, evicting least recently used first."""
    from systems.engine.cuda_graph import GraphCache

    c = GraphCache(torch.device("cpu"), emulate=True, capture_after=1, max_graphs=2)
    fn = lambda x: (x + 1,)  # noqa: E731
    assert all(c.capture(("warm", i), fn, torch.ones(1)) for i in range(5))
    assert not c.capture(("warm", 0), fn, torch.ones(1))  # already there
    assert len(c.graphs) == 5 and c.stats["evictions"] == 0
    for i in range(2):
        c.run(("serve", i), fn, torch.ones(1))
    assert len(c.graphs) == 7 and c.stats["evictions"] == 0
    c.run(("serve", 2), fn, torch.ones(1))
    assert len(c.graphs) == 7 and c.stats["evictions"] == 1 and ("warm", 0) not in c.graphs


def test_a_size_off_the_ladder_always_replays_the_smallest_larger_graph():
    from systems.engine.cuda_graph import GraphCache

    c = GraphCache(torch.device("cpu"), emulate=True, capture_after=3, batch_sizes=(4, 8))
    fn = lambda x: (x + 1,)  # noqa: E731
    for b in (8, 6):
        for _ in range(3):
            c.run((b, 1, 64), fn, torch.zeros(b))
    assert set(c.graphs) == {(8, 1, 64), (6, 1, 64)}
    assert c.padded_key((5, 1, 64)) == (6, 1, 64)  # the smallest larger, same queries and scan
    for _ in range(4):  # however often it recurs: never a graph of its own (SGLang's ladder)
        assert c.padded_key((5, 1, 64)) == (6, 1, 64)
    # no graph with this scan or width: the ladder's next size, to be captured
    assert c.padded_key((5, 1, 128)) == (8, 1, 128) and c.padded_key((5, 4, 64)) == (8, 4, 64)
    assert c.padded_key((8, 1, 64)) is None and c.padded_key((9, 1, 64)) is None
    assert c.padded_key((3, 1, 64)) == (4, 1, 64)  # never past the ladder's next size (4)
    assert c.stats["padded_replays"] == 5


def test_a_size_off_the_ladder_without_a_larger_graph_runs_as_the_next_ladder_size():
    from systems.engine.cuda_graph import GraphCache

    c = GraphCache(torch.device("cpu"), emulate=True, capture_after=2, batch_sizes=(1, 4, 8))
    fn = lambda x: (x + 1,)  # noqa: E731
    assert c.padded_key((3, 1, 64)) == (4, 1, 64)  # nothing captured: the ladder's next size
    assert c.padded_key((4, 1, 64)) is None and c.padded_key((9, 1, 64)) is None  # on / past it
    for _ in range(2):  # sizes 3 and 2 both count toward the ladder size they run as
        c.run((4, 1, 64), fn, torch.zeros(4))
    assert set(c.graphs) == {(4, 1, 64)} and c.stats["eager_steps"] == 1
    assert c.padded_key((3, 1, 64)) == (4, 1, 64) and c.stats["padded_replays"] == 1
    with pytest.raises(ValueError, match="cuda_graph_bs"):
        GraphCache(torch.device("cpu"), emulate=True, batch_sizes=(0, 4))
    for bad in ("abc", "[0,4]", "[2.5]"):
        with pytest.raises(ValueError, match="engine.cuda_graph_bs"):
            make_engine("+engine.cuda_graph_emulate=true", f"engine.cuda_graph_bs={bad}")
    eng = make_engine("+engine.cuda_graph_emulate=true", "engine.cuda_graph_bs=[8,1,4]")
    assert eng.graph_runner.cache.batch_sizes == [1, 4, 8] == eng.graph_runner.drafter.batch_sizes
    # no graph has more rows than the backend has slots: the ladder ends at them (a larger
    # padded graph would grow the resolver's per-row scratch under the graphs captured before)
    eng = make_engine(
        "+engine.cuda_graph_emulate=true",
        "engine.cuda_graph_bs=[1,4,8,16]",
        "hardware.max_running_requests=6",
    )
    r = eng.graph_runner
    assert r.cache.batch_sizes == [1, 4, 6] == r.drafter.batch_sizes
    assert r.ladder_up_to(6) == [1, 4, 6] and r.cache.padded_key((5, 1, 64)) == (6, 1, 64)


def _drain(eng, prompts, first=12, step=8):
    """A draining batch: request i capped at first + step i tokens. Returns the outputs and the
    backend's selection counters."""
    from systems.engine.request import Request, SamplingParams

    reqs = [
        Request(eng.new_rid(), p, SamplingParams(max_new_tokens=first + step * i))
        for i, p in enumerate(prompts)
    ]
    for r in reqs:
        eng.submit(r)
    eng.run_until_idle()
    counted = {k: v for k, v in eng.backend.metrics().items() if k.startswith("dhs_selected")}
    return [r.output_ids for r in reqs], counted


@pytest.mark.parametrize(
    "system",
    ["resident", "hisparse", "adaptive_hisparse", "adaptive_dhisparse", "resident_dflash2"],
)
@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
def test_padded_replays_give_the_exact_batch_tokens_and_counters(system, model):
    """A draining batch (outputs of 10 .. 28 tokens) replays the larger graphs with padding rows
    on the backend's padding slot (the drafter's graphs too): the same tokens as without graphs
    (under calibrated acceptance the drafts are output), the same selection counters (padding
    rows count nothing), memory whole after every request."""
    from tests.helpers import golden_prompts

    prompts = golden_prompts()[:4]
    extra = ["system.kv.hot_cache_rows=8"] if "hisparse" in system else []
    if "dflash" in system or "dhisparse" in system:
        extra += ["system.speculation.acceptance=calibrated", "system.speculation.window=64"]

    def run(*graph):
        eng = make_engine(
            f"model={model}",
            f"system={system}",
            "hardware.kv_pool_gib=0.01",
            "engine.cuda_graph_scan_step=16",
            *extra,
            *graph,
        )
        outs, counted = _drain(eng, prompts, first=10, step=6)
        eng.backend.check_integrity()
        assert eng.backend.is_empty
        return outs, counted, eng

    want, want_counts, _ = run()
    got, got_counts, eng = run(
        "+engine.cuda_graph_emulate=true", "engine.cuda_graph_capture_after=2"
    )
    assert got == want and got_counts == want_counts
    st = eng.graph_runner.stats
    assert st["padded_replays"] > 0 and st["captures"] > 0
    if eng.cfg.speculation:  # the drafter's proposal and catch-up pad the same way
        assert eng.graph_runner.drafter.stats["padded_replays"] > 0
    assert eng.backend.pad_slot == eng.backend.num_slots


def test_disable_cuda_graph_and_no_gpu_mean_no_runner():
    assert make_engine().graph_runner is None  # CPU without emulation
    assert (
        make_engine(
            "+engine.cuda_graph_emulate=true", "engine.disable_cuda_graph=true"
        ).graph_runner
        is None
    )


def test_check_script_cpu_dry_run(tmp_path):
    """benchmarks/check_cuda_graph.py end to end on CPU (emulated graphs, tiny model): the
    record holds identical tokens and selection counters for each system, a draining batch
    (``--stagger``) replayed with padding rows, and the environment it ran in."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "check.json"
    r = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "check_cuda_graph.py"),
            "--cpu-dry-run",
            "--model",
            "tiny",
            "--context",
            "40",
            "--new-tokens",
            "5",
            "--batch",
            "3",
            "--stagger",
            "6",
            "--hot-cache-rows",
            "16",
            "--systems",
            "hisparse,resident_dflash2",
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert [row["tokens_identical"] for row in rec["rows"]] == [True, True]
    assert all(row["selection_counters_identical"] for row in rec["rows"])
    assert rec["rows"][0]["graph_stats"]["padded_replays"] > 0  # the draining batch padded
    assert rec["env"]["python"] and rec["rows"][1]["drafter_graph_stats"]["captures"] >= 1


@pytest.mark.parametrize("system", ["resident_dflash2", "adaptive_dhisparse"])
def test_padding_rows_of_a_block_wider_than_a_page_stay_on_the_padding_slots_pages(system):
    """Padding rows take positions 0 .. Q-1 of the padding slot: with Q (k_max 24) past a page
    (16 positions), every write location is the padding slot's own, past the pool's pages."""
    eng = make_engine(
        "model=tiny",
        f"system={system}",
        "system.speculation.k_max=24",
        "system.speculation.window=64",
        "hardware.kv_pool_gib=0.02",
        "hardware.max_running_requests=4",
    )
    be = eng.backend
    assert be.q_max > be.P and be.pad_pages == 2
    pos = torch.arange(be.q_max).expand(2, be.q_max).contiguous()
    be.begin_step(torch.full((2,), be.pad_slot), pos, 64)
    loc = be._step["index_write_loc"]
    first = be.index_pages.num_pages * be.P  # the padding slot's pages follow the pool's
    assert int(loc.min()) >= first and int(loc.max()) < be.index_pool.shape[1]
    if hasattr(be, "pad_page"):  # its payload page: past the pool's pages, in every source
        w = be._step["write_loc"]
        assert bool(((w // be.G) % (be.NG // be.G) == be.pad_page).all())
    be.end_step()


@pytest.mark.parametrize("system", ["adaptive_dhisparse", "adaptive_dhisparse_dspark"])
def test_start_up_warm_up_captures_the_ladder_and_the_run_replays_it(system):
    """engine.cuda_graph_warmup: before any request, the ladder sizes up to the engine's slots
    are captured for every scan bucket of the workload's context range, on padding rows only
    (target; the drafter's proposal and catch-up too). A draining batch then captures nothing
    (exact sizes wait for their 100th use here) and gives the tokens and selection counters of
    a run without graphs."""
    from tests.helpers import golden_prompts

    prompts = [p[:40] for p in golden_prompts()[:5]]
    extra = ["system.kv.hot_cache_rows=8"]
    if "dhisparse" in system:
        extra += ["system.speculation.acceptance=calibrated", "system.speculation.window=64"]

    def run(*graph):
        eng = make_engine(
            "model=tiny",
            f"system={system}",
            "hardware.kv_pool_gib=0.01",
            "hardware.max_running_requests=6",
            "engine.cuda_graph_scan_step=16",
            "workload.input_len=40",
            "workload.output_len=44",
            *extra,
            *graph,
        )
        before = None if eng.graph_runner is None else dict(eng.graph_runner.stats)
        return *_drain(eng, prompts), eng, before

    want, want_counts, _, _ = run()
    graph = (
        "+engine.cuda_graph_emulate=true",
        "engine.cuda_graph_capture_after=100",
        "engine.cuda_graph_warmup=true",
    )
    got, got_counts, eng, before = run(*graph)
    assert got == want and got_counts == want_counts
    r = eng.graph_runner
    assert r.ladder_up_to(eng.backend.num_slots) == [1, 2, 4, 6]  # the ladder ends at the slots
    q = eng.decoder.verify_queries
    lo, hi = eng.cfg.cuda_graph_warmup_lens
    assert (lo, hi) == (41, 41 + 44 + 2 * eng.decoder.max_queries)
    buckets = {r.scan_len(n) for n in range(lo, hi + 1)}
    assert {k for k in r.graphs} >= {(b, q, L) for b in (1, 2, 4, 6) for L in buckets}
    assert before["captures"] == len(r.graphs) and r.stats["captures"] == before["captures"]
    assert "cuda_graphs" in eng.startup_s
    # under calibrated acceptance DSpark's prefix choice is known at start-up: the warm-up
    # captures that width (not the block), and serving replays only warmed graphs
    assert r.stats["padded_replays"] > 0 and r.stats["eager_steps"] == 0
    if eng.cfg.speculation:
        d, K = r.drafter, eng.decoder.block
        assert q < K if "dspark" in system else q == K
        assert {("propose", b, K) for b in (1, 2, 4, 6)} <= set(d.graphs)
        assert {("catch_up", b, q) for b in (1, 2, 4, 6)} <= set(d.graphs)
        assert d.stats["eager_steps"] == 0 and d.stats["padded_replays"] > 0
    cold = make_engine(
        "model=tiny",
        f"system={system}",
        "hardware.kv_pool_gib=0.01",
        "hardware.max_running_requests=6",
        *extra,
        "+engine.cuda_graph_emulate=true",
        "engine.cuda_graph_warmup=false",
    )
    assert len(cold.graph_runner.graphs) == 0
