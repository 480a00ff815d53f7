"""The layer's small fused kernels (TRITON_INTERPRET=1 on CPU, float32 compute: bf16 arithmetic
is not faithful in the interpreter) against their plain-PyTorch references, on odd shapes."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import fused_ops as fo  # noqa: E402
from systems.models.config import ModelConfig  # noqa: E402
from systems.models.kv_format import encode_rows  # noqa: E402
from tests.kernels.support import interpreted, needs_nvidia_backend, run_compiled  # noqa: E402

pytestmark = interpreted(fo._add_rms_norm_kernel)


@pytest.mark.parametrize("shape", [(1, 1, 7), (3, 5, 64), (2, 1, 130), (0, 1, 16)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_reference(shape, with_delta):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g) * 3
    d = torch.randn(*shape, generator=g) if with_delta else None
    want_x, want_h = fo.add_rms_norm_reference(x, d)
    got_x, got_h = fo.add_rms_norm(x, d)
    assert torch.equal(got_x, want_x)
    torch.testing.assert_close(got_h, want_h, rtol=2e-6, atol=1e-6)
    if not with_delta:
        assert got_x is x  # nothing to add: the residual is passed through, not copied


def test_add_rms_norm_refuses_mismatched_delta_and_unknown_impl():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="does not match"):
        fo.add_rms_norm(x, torch.randn(2, 9))
    with pytest.raises(ValueError, match="does not match"):  # the reference would promote it
        fo.add_rms_norm(x.bfloat16(), torch.randn(2, 8))
    with pytest.raises(ValueError, match="unknown add_rms_norm impl"):
        fo.add_rms_norm(x, None, impl="cuda")


@pytest.mark.parametrize("rows,F", [(1, 1), (5, 37), (3, 1500), (0, 8)])
def test_silu_mul_matches_reference(rows, F):
    g = torch.Generator().manual_seed(rows * 7 + F)
    gu = torch.randn(rows, 2 * F, generator=g) * 4
    torch.testing.assert_close(fo.silu_mul(gu), fo.silu_mul_reference(gu), rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        fo.silu_mul(torch.randn(2, 5))


def _fp8_cfg(kv_dim, rope):
    return ModelConfig(kv_dim=kv_dim, kv_rope_dim=rope, kv_format="fp8")


@pytest.mark.parametrize("kv_dim,rope,rows", [(576, 64, 7), (128, 0, 3), (386, 2, 1), (262, 6, 5)])
def test_encode_fp8_rows_is_byte_identical_to_the_reference(kv_dim, rope, rows):
    cfg = _fp8_cfg(kv_dim, rope)
    g = torch.Generator().manual_seed(kv_dim + rope)
    x = torch.randn(2, rows, kv_dim, generator=g) * 5
    # the hard cases of the rounding: a block spanning subnormals, exact ties, zeros, huge range
    x[0, 0, :128] = torch.logspace(-12, 2, 128) * torch.sign(torch.randn(128, generator=g))
    x[0, -1, :16] = 0.0
    want = encode_rows(x, cfg)
    got = fo.encode_fp8_rows(x, kv_dim, rope, cfg.row_bytes)
    assert got.shape == want.shape and got.dtype == torch.uint8
    assert torch.equal(got, want), (got != want).nonzero()[:8]


def test_e4m3_rounding_on_every_tie_and_the_subnormals():
    # values on every code and on every midpoint between neighbouring codes (both signs):
    # rounding to nearest even must agree with torch's cast everywhere
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (codes[1:] + codes[:-1]) / 2
    vals = torch.cat([codes, mids, mids.nextafter(torch.tensor(0.0)), -codes, -mids])
    vals = torch.cat([vals, torch.tensor([448.0] * 127)])[: 5 * 128]  # whole blocks of 128
    x = vals.reshape(-1, 128)
    x[:, 0] = 448.0  # pin each block's scale to 1 so the values are encoded as given
    cfg = _fp8_cfg(128, 0)
    want = encode_rows(x, cfg)
    got = fo.encode_fp8_rows(x, 128, 0, cfg.row_bytes)
    assert torch.equal(got, want), (got != want).nonzero()[:8]


@pytest.mark.parametrize("kv_dim,rope,rows", [(576, 64, 5), (262, 6, 3), (128, 0, 1)])
def test_encode_fp8_rows_in_place_writes_each_row_at_its_pool_row(kv_dim, rope, rows):
    cfg = _fp8_cfg(kv_dim, rope)
    g = torch.Generator().manual_seed(kv_dim * 7 + rows)
    # a column slice of a wider projection output, as the model passes it
    x = (torch.randn(2, rows, kv_dim + 40, generator=g) * 3)[..., 20 : 20 + kv_dim]
    pool = torch.randint(0, 256, (4 * rows + 3, cfg.row_bytes), generator=g, dtype=torch.uint8)
    before = pool.clone()
    dst = torch.randperm(pool.shape[0], generator=g)[: 2 * rows]  # distinct rows, any order
    got = fo.encode_fp8_rows(x, kv_dim, rope, cfg.row_bytes, pool, dst)
    assert got is pool
    assert torch.equal(pool[dst], encode_rows(x, cfg).reshape(-1, cfg.row_bytes))
    others = torch.ones(pool.shape[0], dtype=torch.bool)
    others[dst] = False
    assert torch.equal(pool[others], before[others])  # nothing else is written


def test_encode_fp8_rows_in_place_refuses_bad_targets():
    x = torch.randn(3, 128)
    rb = _fp8_cfg(128, 0).row_bytes
    pool = torch.zeros(8, rb, dtype=torch.uint8)
    with pytest.raises(ValueError, match="one destination row per row"):
        fo.encode_fp8_rows(x, 128, 0, rb, pool, torch.arange(2))
    with pytest.raises(ValueError, match="one destination row per row"):
        fo.encode_fp8_rows(x, 128, 0, rb, pool)
    with pytest.raises(ValueError, match="uint8"):
        fo.encode_fp8_rows(
            x, 128, 0, rb, torch.zeros(8, rb + 1, dtype=torch.uint8), torch.arange(3)
        )
    with pytest.raises(ValueError, match="contiguous"):
        fo.encode_fp8_rows(
            x, 128, 0, rb, torch.zeros(rb, 8, dtype=torch.uint8).t(), torch.arange(3)
        )


def test_encode_fp8_rows_refuses_a_non_fp8_layout():
    with pytest.raises(ValueError, match="multiple of 128"):
        fo.encode_fp8_rows(torch.randn(2, 100), 100, 0, 100)
    with pytest.raises(ValueError, match="not the fp8 layout"):
        fo.encode_fp8_rows(torch.randn(2, 128), 128, 0, 129)


@pytest.mark.parametrize("di", [17, 64, 100])
@pytest.mark.parametrize("rows", [1, 3, 7])
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_blend_index_query_matches_reference_on_a_strided_column_slice(di, rows, lam):
    g = torch.Generator().manual_seed(di * 31 + rows)
    # as in decode/prefill: a column slice of a wider GEMM output, cut to a query chunk, so the
    # batch and row strides are both wider than di and not each other's multiple of rows
    y = torch.randn(2, rows + 2, di + 45, generator=g) * 3
    iq = y[:, 1 : rows + 1, 20 : 20 + di]
    assert iq.stride() == (y.stride(0), di + 45, 1) and not iq.is_contiguous()
    iq[0, 0] = 0.0  # a zero row: the norm's clamp
    iq[1, -1] *= 1e-8  # a row whose norm is below the clamp
    w_sal = torch.randn(di, generator=g)
    w_sal /= w_sal.norm()
    want = fo.blend_index_query_reference(iq, w_sal, lam)
    got = fo.blend_index_query(iq, w_sal, lam)
    assert got.shape == (2, rows, di) and got.dtype == torch.float32 and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
    assert torch.equal(got[0, 0], lam * w_sal)  # (1 - lam) * 0 + lam * w_sal, exactly


@pytest.mark.parametrize("shape", [(5,), (4, 9), (2, 3, 2, 33), (0, 3, 8), (2, 0, 8)])
def test_blend_index_query_other_ranks_and_empty(shape):
    g = torch.Generator().manual_seed(len(shape))
    iq = torch.randn(*shape, generator=g)
    w_sal = torch.randn(shape[-1], generator=g)
    got = fo.blend_index_query(iq, w_sal, 0.3)
    assert got.shape == iq.shape and got.dtype == torch.float32
    torch.testing.assert_close(
        got, fo.blend_index_query_reference(iq, w_sal, 0.3), rtol=2e-6, atol=1e-6
    )


def test_blend_index_query_reads_bf16():
    # bf16 values are exact in float32, so only the float32 compute may differ
    g = torch.Generator().manual_seed(3)
    y = (torch.randn(1, 4, 96, generator=g) * 2).to(torch.bfloat16)
    iq, w_sal = y[..., 10:74], torch.randn(64, generator=g)
    want = fo.blend_index_query_reference(iq, w_sal, 0.3)
    torch.testing.assert_close(fo.blend_index_query(iq, w_sal, 0.3), want, rtol=2e-6, atol=1e-6)


def test_blend_index_query_refuses_unknown_impl_and_mismatched_w_sal():
    iq = torch.randn(2, 8)
    with pytest.raises(ValueError, match="unknown blend_index_query impl"):
        fo.blend_index_query(iq, torch.randn(8), 0.3, impl="cuda")
    with pytest.raises(ValueError, match="does not match"):
        fo.blend_index_query(iq, torch.randn(9), 0.3)


_BLEND_AOT = r"""
from systems.kernels import fused_ops as fo
from systems.kernels.aot import compile_for_nvidia
for dt in ("*bf16", "*fp32"):
    types = {"iq_ptr": dt, "w_ptr": "*fp32", "out_ptr": "*fp32", "a": "fp32", "b": "fp32"}
    types.update(stride_b="i64", stride_r="i64")
    ptx = compile_for_nvidia(fo._blend_index_query_kernel, dict(BLOCK=128), types).asm["ptx"]
    # the IEEE sqrt and division the reference's are, not the approximate defaults
    assert "sqrt.rn.f32" in ptx and "div.rn.f32" in ptx and "approx" not in ptx, dt
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_blend_index_query_compiles_for_sm90_without_gpu():
    run_compiled(_BLEND_AOT)
