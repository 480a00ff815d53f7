"""Indexer scores over paged keys: Triton kernel (TRITON_INTERPRET=1 on CPU, float32 compute)
against the reference (gather the keys, float32 einsum)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import index_scores as ix  # noqa: E402
from tests.kernels.support import interpreted, needs_nvidia_backend, run_compiled  # noqa: E402

pytestmark = interpreted(ix._index_scores_kernel)


@pytest.mark.parametrize("form", ["dot", "fma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "B,Q,L,di,P", [(1, 1, 1, 16, 4), (3, 2, 37, 24, 8), (2, 17, 130, 64, 16), (4, 5, 200, 40, 64)]
)
def test_kernel_matches_reference(B, Q, L, di, P, dtype, form):
    g = torch.Generator().manual_seed(B * 1000 + L)
    S, pages = 6, -(-L // P) + 1
    pool = torch.randn(S * pages * P, di, generator=g).to(dtype)
    # each slot's pages: a random permutation of page ids, some logical pages left unmapped
    table = torch.stack([torch.randperm(S * pages, generator=g)[:pages] for _ in range(S)])
    table = table.to(torch.int32)
    # a page of the history without an id (the last one positions 0..L-1 read) reads row 0, as
    # the reference's clamp does
    table[1, (L - 1) // P] = -1
    slots = torch.randperm(S, generator=g)[:B]
    slots[0] = 1
    iq = torch.randn(B, Q, di, generator=g)
    ref = ix.index_scores(iq, pool, table, slots, L, P, impl="reference")
    tri = ix.index_scores_triton(iq, pool, table, slots, L, P, form=form)
    assert tri.shape == (B, Q, L) and tri.dtype == torch.float32
    torch.testing.assert_close(tri, ref, rtol=1e-5, atol=1e-5)


def test_unknown_form_is_a_clear_error():
    z = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="dot or fma"):
        ix.index_scores_triton(
            z,
            torch.zeros(4, 16),
            torch.zeros(1, 1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.long),
            1,
            4,
            form="wmma",
        )


_AOT = r"""
from systems.kernels import index_scores as ix
for v in (dict(), dict(pool_type="fp32"), dict(DI=24, DI_P=32, BLOCK_Q=32), dict(FMA=True, BLOCK_Q=1),
          dict(FMA=True, BLOCK_Q=8, BLOCK_L=64)):
    k = ix.aot_compile(90, **v)
    assert "ld.global" in k.asm["ptx"], v
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_kernel_compiles_for_sm90_without_gpu():
    run_compiled(_AOT)


def test_auto_selfcheck_passes_and_falls_back_on_a_bad_kernel(monkeypatch):
    """model.attention_impl=auto: the kernels are checked against their references once per
    device; a kernel that disagrees (or raises) sends auto to the reference, with the reason."""
    from systems.kernels import selfcheck
    from systems.kernels import sparse_attention as sa

    cpu = torch.device("cpu")
    monkeypatch.setattr(selfcheck, "_VERDICT", {})
    assert selfcheck.check_kernels(cpu) == (True, "ok")  # here: under the interpreter
    assert selfcheck.resolve_impl("auto", cpu) == "reference"  # auto never picks triton on CPU
    assert selfcheck.resolve_impl("triton", cpu) == "triton"

    monkeypatch.setattr(selfcheck, "_VERDICT", {})
    real = sa.sparse_attention_triton
    monkeypatch.setattr(sa, "sparse_attention_triton", lambda *a, **k: real(*a, **k) * 1.01)
    ok, why = selfcheck.check_kernels(cpu)
    assert not ok and "sparse attention (triton) differs" in why

    monkeypatch.setattr(selfcheck, "_VERDICT", {})

    def broken(*a, **k):
        raise RuntimeError("no kernel image for this GPU")

    monkeypatch.setattr(ix, "index_scores_triton", broken)
    monkeypatch.setattr(sa, "sparse_attention_triton", real)
    ok, why = selfcheck.check_kernels(cpu)
    assert not ok and "no kernel image" in why
