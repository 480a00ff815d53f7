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


def test_a_key_is_captured_at_its_capture_after_th_use_and_replayed_after():
    """Uses before ``capture_after`` run eagerly (same results, nothing recorded); the
    capture_after-th use captures; later uses replay. Passing keys are forgotten LRU-first."""
    from systems.engine.cuda_graph import GraphCache

    c = GraphCache(torch.device("cpu"), emulate=True, capture_after=3, max_graphs=1)
    fn = lambda x: (x * 2,)  # noqa: E731
    outs = [c.run(("b", 4), fn, torch.full((2,), float(i)))[0].tolist() for i in range(5)]
    assert outs == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0], [6.0, 6.0], [8.0, 8.0]]
    assert c.stats == {"captures": 1, "replays": 2, "evictions": 0, "eager_steps": 2}
    for i in range(6):  # six sizes met once each: eager, and remembered at most 4 x max_graphs
        c.run(("pass", i), fn, torch.ones(1))
    assert c.stats["captures"] == 1 and len(c._seen) == 4
    with pytest.raises(ValueError, match="capture_after"):
        GraphCache(torch.device("cpu"), emulate=True, capture_after=0)


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
    record holds identical tokens for each system and the environment it ran in."""
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
            "2",
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
    assert rec["env"]["python"] and rec["rows"][1]["drafter_graph_stats"]["captures"] >= 1
