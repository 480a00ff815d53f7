"""Kernel names and enclosing ranges -> families; kernel events of a (synthetic) GPU trace."""

from __future__ import annotations

import pytest

from profiling import ranges as R
from profiling.kernel_timeline import (
    analyze_trace,
    classify,
    classify_name,
    family_from_ranges,
    kernel_events,
    step_windows,
)


@pytest.mark.parametrize(
    "name,family",
    [
        ("_resolver_kernel", "resolver"),
        ("Memcpy DtoH (Device -> Pinned)", "host_backup"),
        ("Memcpy HtoD (Pinned -> Device)", "host_backup"),
        ("void at::native::index_put_kernel_impl<...>", "page_bookkeeping"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, ...>",
            "page_bookkeeping",
        ),
        ("Memset (Device)", "page_bookkeeping"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "dense_projection"),
        ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "dense_projection"),
        ("cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "dense_projection"),
        ("aten::mm", "dense_projection"),
        ("aten::matmul", "dense_projection"),
        (
            "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>",
            "indexing_attention",
        ),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>",
            "indexing_attention",
        ),
        ("void at::native::masked_fill_kernel<bool>", "indexing_attention"),
        ("void at::native::index_elementwise_kernel<128, 4, ...>", "indexing_attention"),
        ("aten::softmax", "indexing_attention"),
        ("void at::native::reduce_kernel<512, 1, ...>", "other_model"),
        ("aten::rsqrt", "other_model"),
        # the engine's own Triton kernels, named as the H200 traces name them: in a replayed
        # CUDA graph no range reaches them, so the name must put each where its eager range does
        ("_sparse_attention_mma_kernel", "indexing_attention"),
        ("_sparse_attention_kernel", "indexing_attention"),
        ("_combine_kernel", "indexing_attention"),
        ("_index_scores_kernel", "indexing_attention"),
        ("_blend_index_query_kernel", "indexing_attention"),
        ("_topk_kernel", "indexing_attention"),
        ("_ring_attention_kernel", "indexing_attention"),
        ("_copy_grid_kernel", "resolver"),
        ("_step_tables_kernel", "page_bookkeeping"),
        ("_copy_rows_kernel", "host_backup"),
        ("_mm_kernel", "dense_projection"),
        (
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel"
            "<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
            "indexing_attention",
        ),
        ("_add_rms_norm_kernel", "other_model"),
        ("_encode_fp8_kernel", "other_model"),
    ],
)
def test_name_patterns(name, family):
    assert classify_name(name) == family


def test_ranges_override_names():
    gemm = "sm90_xmma_gemm_bf16bf16"
    assert classify(gemm, (R.STEP, R.MLP)) == "expert_mlp_matmul"
    assert classify(gemm, (R.STEP, R.PROJ)) == "dense_projection"
    assert classify("aten::copy_", (R.STEP, R.BACKUP)) == "host_backup"
    assert classify("aten::copy_", (R.POPULATE,)) == "host_backup"
    assert classify("index_put_kernel", (R.SELECT,)) == "indexing_attention"
    assert classify("anything", (R.ATTEND,)) == "indexing_attention"
    assert classify("anything", (R.BOOKKEEPING,)) == "page_bookkeeping"
    assert classify("anything", (R.HANDOFF,)) == "handoff"
    # a range without a family (the step) leaves the name to decide
    assert classify("_resolver_kernel", (R.STEP,)) == "resolver"


def test_innermost_range_wins_except_priority():
    assert family_from_ranges((R.MLP, R.RESOLVER)) == "resolver"
    assert family_from_ranges((R.RESOLVER, R.BOOKKEEPING)) == "page_bookkeeping"
    # a follower layer's transfer calls the resolver: it stays a follower copy
    assert family_from_ranges((R.FOLLOWER_PREFETCH, R.RESOLVER)) == "follower_copy"
    assert family_from_ranges((R.STEP,)) is None
    assert family_from_ranges(()) is None


def test_every_range_maps_to_a_known_family():
    for name, fam in R.RANGE_FAMILY.items():
        assert name.startswith(R.PREFIX)
        assert fam in R.FAMILIES
    assert set(R.CACHE_FAMILIES).isdisjoint(R.MODEL_FAMILIES)


# ------------------------------------------------------------------ a synthetic GPU trace
def _x(cat, name, ts, dur, pid=1, tid=10, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def gpu_trace():
    """Two steps launched from thread 10; kernels on streams 7 (main) and 9 (side).

    step 0 (CPU 0-50): proj gemm, resolver, follower copy on the side stream (launched under
    dhs::follower_prefetch, calling the resolver), mlp gemm; step 1 (CPU 60-100): one gemm
    whose kernel runs past the end of the step's other kernels, and a backup memcpy.
    A kernel launched outside any step (admission) overlaps step 0 on the GPU."""
    ev = [
        _x("user_annotation", R.STEP, 0, 50),
        _x("user_annotation", R.STEP, 60, 40),
        _x("user_annotation", R.PROJ, 1, 4),
        _x("user_annotation", R.RESOLVER, 6, 4),
        _x("user_annotation", R.FOLLOWER_PREFETCH, 11, 6),
        _x("user_annotation", R.RESOLVER, 12, 3),
        _x("user_annotation", R.MLP, 20, 5),
        _x("user_annotation", R.MLP, 61, 5),
        _x("user_annotation", R.BACKUP, 70, 5),
        # GPU-side shadows of the ranges must not disturb step numbering
        _x("gpu_user_annotation", R.STEP, 100, 60, pid=0, tid=7),
        # launches (CPU side)
        _x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=1),
        _x("cuda_driver", "cuLaunchKernel", 7, 1, correlation=2),
        _x("cuda_driver", "cuLaunchKernel", 13, 1, correlation=3),
        _x("cuda_runtime", "cudaLaunchKernel", 21, 1, correlation=4),
        _x("cuda_runtime", "cudaLaunchKernel", 55, 1, correlation=5),  # between steps
        _x("cuda_runtime", "cudaLaunchKernel", 62, 1, correlation=6),
        _x("cuda_runtime", "cudaMemcpyAsync", 71, 1, correlation=7),
        # device events (GPU time)
        _x("kernel", "sm90_xmma_gemm_bf16", 100, 10, pid=0, tid=7, correlation=1, stream=7),
        _x("kernel", "_resolver_kernel", 110, 5, pid=0, tid=7, correlation=2, stream=7),
        _x("kernel", "_resolver_kernel", 112, 8, pid=0, tid=9, correlation=3, stream=9),
        _x("kernel", "sm90_xmma_gemm_bf16", 120, 20, pid=0, tid=7, correlation=4, stream=7),
        _x(
            "gpu_memcpy",
            "Memcpy HtoD (Pinned -> Device)",
            135,
            15,
            pid=0,
            tid=9,
            correlation=5,
            stream=9,
        ),
        _x("kernel", "sm90_xmma_gemm_bf16", 200, 30, pid=0, tid=7, correlation=6, stream=7),
        _x(
            "gpu_memcpy",
            "Memcpy DtoH (Device -> Pinned)",
            205,
            5,
            pid=0,
            tid=9,
            correlation=7,
            stream=9,
        ),
    ]
    return {"traceEvents": ev}


def test_gpu_trace_events_families_and_steps():
    evs = kernel_events(gpu_trace())
    got = [(k.name.split("(")[0].strip(), k.family, k.step) for k in evs]
    assert got == [
        ("sm90_xmma_gemm_bf16", "dense_projection", 0),
        ("_resolver_kernel", "resolver", 0),
        ("_resolver_kernel", "follower_copy", 0),
        ("sm90_xmma_gemm_bf16", "expert_mlp_matmul", 0),
        ("Memcpy HtoD", "host_backup", None),
        ("sm90_xmma_gemm_bf16", "expert_mlp_matmul", 1),
        ("Memcpy DtoH", "host_backup", 1),
    ]
    assert evs[2].lane == 9 and evs[2].kind == "kernel"
    assert step_windows(evs) == {0: (100.0, 140.0), 1: (200.0, 230.0)}
    # period: to the next step's first kernel; the last step's gap is unknown, so it is left out
    assert step_windows(evs, "period") == {0: (100.0, 200.0)}


def test_gpu_trace_partition_per_step():
    rep = analyze_trace(gpu_trace())
    s0, s1 = rep.steps
    # step 0 window 100-140: gemm 100-110 | resolver 110-112 | resolver+follower 112-115 |
    # follower 115-120 | mlp 120-135 | mlp + admission memcpy 135-140
    assert s0["dur_us"] == 40
    assert s0["alone_dense_projection_us"] == 10
    assert s0["alone_resolver_us"] == 2
    assert s0["alone_follower_copy_us"] == 5
    assert s0["alone_expert_mlp_matmul_us"] == 15
    assert s0["several_us"] == 3 + 5
    assert s0["idle_us"] == 0
    assert s0["work_resolver_us"] == 5 and s0["work_follower_copy_us"] == 8
    assert s0["cache_work_us"] == 5 + 8 + 5  # the admission copy overlaps the window by 5
    assert s0["resolver_calls"] == 1
    assert s0["resolver_share"] == pytest.approx(5 / 40)
    assert s1["alone_expert_mlp_matmul_us"] == 25 and s1["several_us"] == 5
    assert rep.summary["num_steps"] == 2
    shares = rep.summary["share_of_step_pct"]
    assert sum(shares.values()) == pytest.approx(100.0)


def test_profiler_step_ranges_are_the_fallback():
    tr = gpu_trace()
    for e in tr["traceEvents"]:
        if e["name"] == R.STEP and e["cat"] == "user_annotation":
            e["name"] = f"ProfilerStep#{int(e['ts'])}"
    evs = kernel_events(tr)
    assert [k.step for k in evs] == [0, 0, 0, 0, None, 1, 1]


def test_trace_roundtrip_through_a_file(tmp_path):
    import gzip
    import json

    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(gpu_trace(), f)
    assert len(analyze_trace(p).steps) == 2


# the engine's launched Triton kernels that are "other model kernels" by design (norms, the
# activation, the rows' fp8 encoding, the tokens' readback)
OTHER_BY_DESIGN = {
    "_add_rms_norm_kernel",
    "_silu_mul_kernel",
    "_encode_fp8_kernel",
    "_readback_kernel",
}


def test_every_engine_kernel_has_a_family_by_name():
    """A Triton kernel added to systems/ must be classified by its name (a replayed CUDA graph
    gives it no range), or be listed above as other model work on purpose."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "systems"
    names = {
        m.group(1)
        for f in src.rglob("*.py")
        for m in re.finditer(r"@triton\.jit[^\n]*\n\s*def (\w+_kernel)\(", f.read_text())
    }
    assert "_sparse_attention_mma_kernel" in names  # the scan finds the kernels
    unclassified = {n for n in names if classify_name(n) == "other_model"} - OTHER_BY_DESIGN
    assert not unclassified, f"kernels with no family by name: {sorted(unclassified)}"
