"""The batch-invariant GEMM: Triton kernel (TRITON_INTERPRET=1 on CPU, float32) against the
plain product, and a row's bits against the number of rows beside it."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import gemm  # noqa: E402
from tests.kernels.support import interpreted, needs_nvidia_backend, run_compiled  # noqa: E402

pytestmark = interpreted(gemm._mm_kernel)


def _case(M, K, N, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g), torch.randn(K, N, generator=g) / K**0.5


@pytest.mark.parametrize("M,K,N", [(1, 7, 5), (3, 70, 130), (65, 129, 64), (5, 600, 33)])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_kernel_matches_the_plain_product(M, K, N, splits):
    x, w = _case(M, K, N, M + K + N)
    got = gemm.mm_triton(x, w, splits=splits)
    torch.testing.assert_close(got, gemm.mm_reference(x, w), rtol=2e-5, atol=2e-5)


def test_leading_dimensions_and_dispatch():
    x, w = _case(6, 40, 24, 1)
    x3 = x.reshape(2, 3, 40)
    assert gemm.mm(x3, w, "triton").shape == (2, 3, 24)
    torch.testing.assert_close(gemm.mm(x3, w, "triton"), gemm.mm(x3, w, "cublas"))
    with pytest.raises(ValueError, match="gemm impl"):
        gemm.mm(x, w, "nope")
    with pytest.raises(ValueError, match="columns"):
        gemm.mm_triton(x[:, :39], w)


def test_a_prefills_long_product_runs_unsplit(monkeypatch):
    """Past SPLIT_MAX_ROWS rows (a prompt's prefill) no float32 partials: one chunk."""
    x, w = _case(9, 1100, 24, 2)
    assert gemm.split_k(1100, 24) == 2
    monkeypatch.setattr(gemm, "SPLIT_MAX_ROWS", 8)
    assert torch.equal(gemm.mm_triton(x, w), gemm.mm_triton(x, w, splits=1))
    assert not torch.equal(gemm.mm_triton(x[:8], w), gemm.mm_triton(x[:8], w, splits=1))


def test_split_count_depends_on_the_weight_alone():
    assert gemm.split_k(4096, 4096) == 5  # 64 N tiles: ~264 programs with 5 chunks of K
    assert gemm.split_k(4096, 32000) == 1 and gemm.split_k(511, 64) == 1
    assert gemm.split_k(9216, 4096) == 5 and gemm.split_k(1024, 576) == 2


@pytest.mark.parametrize("splits", [1, 3])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(splits):
    """Rows 0 .. n-1 of an M-row product equal the n-row product bit for bit, across an M
    tile boundary. Negative control: chunks chosen from M (as a shape heuristic would) change
    the bits."""
    x, w = _case(70, 1100, 40, 3)
    full = gemm.mm_triton(x, w, splits=splits)
    for n in (1, 17, 64, 65):
        assert torch.equal(gemm.mm_triton(x[:n], w, splits=splits), full[:n])
    by_m = [gemm.mm_triton(x[:n], w, splits=1 if n < 20 else 3) for n in (17, 70)]
    assert not torch.equal(by_m[0], by_m[1][:17])


_AOT = r"""
from systems.kernels import gemm
for v in (dict(), dict(split=3), dict(dtype="fp32")):
    k = gemm.aot_compile(90, **v)
    ptx = k.asm["ptx"]
    assert "mma" in ptx or "wgmma" in ptx or v.get("dtype") == "fp32", v  # tensor-core dots
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_kernel_compiles_for_sm90_without_gpu():
    run_compiled(_AOT)
