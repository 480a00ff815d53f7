"""Sparse attention: Triton kernel (TRITON_INTERPRET=1 on CPU, float32 compute) against the
reference path of the model (gather, decode_rows, einsum-softmax-einsum)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import sparse_attention as sa  # noqa: E402
from systems.models.config import ModelConfig  # noqa: E402
from systems.models.kv_format import encode_rows  # noqa: E402
from tests.kernels.support import interpreted, needs_nvidia_backend, run_compiled  # noqa: E402

pytestmark = interpreted(sa._sparse_attention_kernel)


def _case(fmt, N, H, k, d, rope, M, pad, seed):
    g = torch.Generator().manual_seed(seed)
    cfg = ModelConfig(kv_format=fmt, kv_dim=d, kv_rope_dim=rope if fmt == "fp8" else 0)
    kv = encode_rows(torch.randn(M, d, generator=g) * 2.0, cfg)  # [M, row_bytes]
    sel = torch.randint(0, 10_000, (N, k), generator=g)
    loc = torch.randint(0, M, (N, k), generator=g)  # duplicates across and within queries
    drop = torch.rand(N, k, generator=g) < pad
    drop[:, 0] = False  # a query always selects something (its own position)
    sel = torch.where(drop, -1, sel)
    loc = torch.where(drop, -1, loc)
    # the contract's last clause: a negative location under a real selection reads row 0
    loc = torch.where(~drop & (torch.rand(N, k, generator=g) < 0.1), -3, loc)
    q = torch.randn(N, H, d, generator=g)
    return cfg, kv, sel, loc, q


@pytest.mark.parametrize("fmt,d,rope", [("bf16", 40, 0), ("fp8", 320, 64), ("fp8", 176, 48)])
@pytest.mark.parametrize("N,H,k", [(1, 1, 1), (3, 3, 37), (5, 4, 70)])
def test_kernel_matches_reference(fmt, d, rope, N, H, k):
    cfg, kv, sel, loc, q = _case(fmt, N, H, k, d, rope, M=53, pad=0.3, seed=N * 100 + k)
    kw = dict(kv_format=fmt, kv_dim=d, rope_dim=cfg.kv_rope_dim, row_dtype=torch.float32)
    ref = sa.sparse_attention(q, kv, sel, loc, impl="reference", **kw)
    tri = sa.sparse_attention(q, kv, sel, loc, impl="triton", **kw)
    torch.testing.assert_close(tri, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fmt,d,rope", [("bf16", 40, 0), ("fp8", 176, 48)])
@pytest.mark.parametrize(
    "N,H,k,splits", [(1, 1, 1, 4), (3, 3, 37, 3), (5, 4, 70, 2), (2, 5, 45, 100)]
)
def test_split_k_matches_reference(fmt, d, rope, N, H, k, splits):
    """Chunks of the k rows per (query, head), merged by the combine launch: same function
    (a split count past the tiles is clamped to one chunk per tile)."""
    cfg, kv, sel, loc, q = _case(fmt, N, H, k, d, rope, M=53, pad=0.3, seed=N * 100 + k)
    kw = dict(kv_format=fmt, kv_dim=d, rope_dim=cfg.kv_rope_dim, row_dtype=torch.float32)
    ref = sa.sparse_attention_reference(q, kv, sel, loc, **kw)
    tri = sa.sparse_attention_triton(q, kv, sel, loc, splits=splits, block_k=16, **kw)
    torch.testing.assert_close(tri, ref, rtol=2e-5, atol=2e-5)


def test_split_k_with_a_chunk_of_padding_only():
    """A chunk whose selections are all padding contributes nothing to the merge."""
    cfg, kv, sel, loc, q = _case("fp8", 2, 3, 48, 176, 48, M=29, pad=0.0, seed=5)
    sel[:, 16:] = -1
    kw = dict(kv_format="fp8", kv_dim=176, rope_dim=48, row_dtype=torch.bfloat16)
    ref = sa.sparse_attention_reference(q, kv, sel, loc, **kw)
    tri = sa.sparse_attention_triton(q, kv, sel, loc, splits=3, block_k=16, **kw)
    torch.testing.assert_close(tri, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fmt,d,rope", [("bf16", 40, 0), ("fp8", 176, 48)])
@pytest.mark.parametrize(
    "N,H,k,splits", [(1, 1, 1, None), (3, 3, 37, 3), (5, 4, 70, None), (2, 17, 45, 2)]
)
def test_mma_kernel_matches_reference(fmt, d, rope, N, H, k, splits):
    """All heads per program with dots (float32 here; the bf16 tensor-core path is checked by
    the sm90 compile below and on the GPU, bf16 arithmetic being unreliable in the
    interpreter), chunks merged like the per-head kernel's: same function. The default split
    runs the default tile (32 rows), an explicit one 16-row tiles."""
    cfg, kv, sel, loc, q = _case(fmt, N, H, k, d, rope, M=53, pad=0.3, seed=N * 100 + k)
    kw = dict(kv_format=fmt, kv_dim=d, rope_dim=cfg.kv_rope_dim, row_dtype=torch.float32)
    ref = sa.sparse_attention_reference(q, kv, sel, loc, **kw)
    bk = None if splits is None else 16
    tri = sa.sparse_attention_triton(q, kv, sel, loc, kernel="mma", splits=splits, block_k=bk, **kw)
    torch.testing.assert_close(tri, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kernel", ["per_head", "mma"])
def test_strided_query_rows_and_int32_locations(kernel):
    """q as a column slice of a wider projection (rows strided, heads packed) is read in place,
    and int32 locations (the resolver's) give the same result as int64 ones."""
    cfg, kv, sel, loc, q = _case("fp8", 3, 3, 37, 176, 48, M=53, pad=0.3, seed=11)
    wide = torch.randn(3, 7 + 3 * 176 + 5)
    wide[:, 7 : 7 + 3 * 176] = q.reshape(3, -1)
    q_view = wide[:, 7 : 7 + 3 * 176].reshape(3, 3, 176)
    assert not q_view.is_contiguous() and q_view.data_ptr() == wide[:, 7:].data_ptr()
    kw = dict(kv_format="fp8", kv_dim=176, rope_dim=48, row_dtype=torch.float32)
    ref = sa.sparse_attention_reference(q, kv, sel, loc, **kw)
    tri = sa.sparse_attention_triton(q_view, kv, sel, loc.to(torch.int32), kernel=kernel, **kw)
    torch.testing.assert_close(tri, ref, rtol=2e-5, atol=2e-5)


def test_unknown_kernel_is_a_clear_error():
    cfg, kv, sel, loc, q = _case("bf16", 1, 1, 4, 16, 0, M=5, pad=0.0, seed=1)
    with pytest.raises(ValueError, match="unknown sparse attention kernel"):
        sa.sparse_attention_triton(
            q,
            kv,
            sel,
            loc,
            kv_format="bf16",
            kv_dim=16,
            rope_dim=0,
            row_dtype=torch.float32,
            kernel="nope",
        )


def test_split_count_depends_on_k_alone():
    assert sa.split_count(512, 32) == 4 and sa.split_count(512, 16) == 4  # 128-row chunks
    assert sa.split_count(1024, 16) == 8 and sa.split_count(128, 32) == 1
    assert sa.split_count(300, 32) == 3 and sa.split_count(0, 32) == 1
    assert sa.split_count(512, 32, rows=100) == 4  # chunks of whole tiles: 128 rows


@pytest.mark.parametrize("kernel", ["per_head", "mma"])
def test_a_querys_output_does_not_depend_on_the_batch(kernel, monkeypatch):
    """The first rows of a launch give the same bits whatever the launch's batch (padding rows,
    other requests): the chunk count is fixed by k. Negative control: a count that depends on
    the number of queries (as one chosen to fill the GPU would) changes the bits."""
    cfg, kv, sel, loc, q = _case("bf16", 12, 2, 70, 40, 0, M=53, pad=0.2, seed=11)
    kw = dict(kv_format="bf16", kv_dim=40, rope_dim=0, row_dtype=torch.float32, kernel=kernel)
    monkeypatch.setattr(sa, "SPLIT_ROWS", 16)  # several chunks at this small k
    assert sa.split_count(70, 16) == 5
    full = sa.sparse_attention_triton(q, kv, sel, loc, block_k=16, **kw)
    for n in (1, 5, 11):
        part = sa.sparse_attention_triton(q[:n], kv, sel[:n], loc[:n], block_k=16, **kw)
        assert torch.equal(part, full[:n])
    by_batch = lambda K, block_k: 5 if q_rows[0] > 6 else 2  # noqa: E731
    q_rows = [0]
    monkeypatch.setattr(sa, "split_count", lambda K, block_k: by_batch(K, block_k))
    outs = []
    for n in (5, 12):
        q_rows[0] = n
        outs.append(sa.sparse_attention_triton(q[:n], kv, sel[:n], loc[:n], block_k=16, **kw))
    assert not torch.equal(outs[0], outs[1][:5])


def test_bf16_rounding_of_decoded_rows_is_the_references():
    """row_dtype=bfloat16: decoded rows are rounded to bf16 before use, as decode_rows does
    (only conversions happen in bf16; arithmetic stays float32 in both)."""
    cfg, kv, sel, loc, q = _case("fp8", 4, 2, 29, 192, 64, M=31, pad=0.2, seed=7)
    kw = dict(kv_format="fp8", kv_dim=192, rope_dim=64, row_dtype=torch.bfloat16)
    ref = sa.sparse_attention(q, kv, sel, loc, impl="reference", **kw)
    tri = sa.sparse_attention(q, kv, sel, loc, impl="triton", **kw)
    torch.testing.assert_close(tri, ref, rtol=2e-5, atol=2e-5)
    unrounded = sa.sparse_attention(
        q, kv, sel, loc, impl="reference", **dict(kw, row_dtype=torch.float32)
    )
    assert not torch.allclose(unrounded, ref, rtol=1e-6, atol=1e-6)  # the rounding is visible


def test_padding_is_masked_and_negative_locations_read_row_zero():
    cfg, kv, sel, loc, q = _case("bf16", 2, 2, 8, 16, 0, M=9, pad=0.0, seed=3)
    kw = dict(kv_format="bf16", kv_dim=16, rope_dim=0, row_dtype=torch.float32)
    base = sa.sparse_attention(q, kv, sel, loc, impl="triton", **kw)
    sel2, loc2 = sel.clone(), loc.clone()
    sel2[:, 4:] = -1  # padded selections do not count, wherever their locations point
    loc2[:, 4:] = torch.randint(0, 9, (2, 4))
    out_a = sa.sparse_attention(q, kv, sel2, loc2, impl="triton", **kw)
    out_b = sa.sparse_attention(
        q, kv, sel2[:, :4].contiguous(), loc2[:, :4].contiguous(), impl="triton", **kw
    )
    torch.testing.assert_close(out_a, out_b, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(out_a, base)
    loc3 = loc.clone()
    loc3[:, 1] = -5  # a selected position at a negative location: row 0 (reference's clamp)
    torch.testing.assert_close(
        sa.sparse_attention(q, kv, sel, loc3, impl="triton", **kw),
        sa.sparse_attention(q, kv, sel, loc3, impl="reference", **kw),
        rtol=2e-5,
        atol=2e-5,
    )


_AOT = r"""
from systems.kernels import sparse_attention as sa
for v in (dict(), dict(fp8=False), dict(q_type="fp32", ROUND_BF16=False), dict(SPLIT=False),
          dict(SPLIT=False, fp8=False), dict(kernel="mma"), dict(kernel="mma", SPLIT=False)):
    k = sa.aot_compile(90, **v)
    ptx = k.asm["ptx"]
    if v.get("kernel") == "mma":  # bf16 tensor-core dots, within sm_90's 227 KB of shared memory
        assert "mma.sync" in ptx or "wgmma" in ptx, v
        assert k.metadata.shared <= 232448, (v, k.metadata.shared)
    assert "ex2.approx" in ptx or "ex2" in ptx, v  # the softmax's exponentials
    if v.get("fp8", True):
        assert "cvt" in ptx and "e4m3" in ptx, "fp8 rows should be converted in registers"
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_kernel_compiles_for_sm90_without_gpu():
    """Compile the real kernel for Hopper in a process without TRITON_INTERPRET."""
    run_compiled(_AOT)


@pytest.mark.slow
def test_bench_script_cpu_dry_run(tmp_path):
    """benchmarks/bench_attention.py end to end at toy sizes on CPU: every section runs, the
    kernels agree with the reference, and the JSON holds each section's rows (the tile sweep
    with the 16-row tile at 8 warps)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "attention.json"
    res = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "bench_attention.py"), "--cpu-dry-run",
         "--out", str(out)],
        cwd=root, env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    d = json.loads(out.read_text())
    assert [r["queries"] for r in d["rows"]] == [1, 2]
    assert all(r[f"{k}_agree"] for r in d["rows"] for k in ("unsplit", "triton", "mma"))
    tiles = {(t["block_k"], t["num_warps"]) for t in d["split_sweep"] if "block_k" in t}
    assert (16, 8) in tiles and (16, 4) in tiles
    assert d["index_scan"] and d["index_sweep"]
