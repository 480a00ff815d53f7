"""The indexer's top-k: Triton radix select (TRITON_INTERPRET=1 on CPU) against the reference,
bit for bit, on odd shapes with many exact ties."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import topk as tk  # noqa: E402
from tests.kernels.support import interpreted, needs_nvidia_backend, run_compiled  # noqa: E402

INF = float("inf")


def _scores(kind: str, B: int, Q: int, L: int, g: torch.Generator) -> torch.Tensor:
    if kind == "few":  # exact ties everywhere, -0.0 beside +0.0, some -inf history
        vals = torch.tensor([-1.5, -0.0, 0.0, 0.25, 3.0, -INF])
        return vals[torch.randint(0, len(vals), (B, Q, L), generator=g)]
    if kind == "near":  # one top 16 bits for all: the threshold is in the low bits, with ties
        return 1.0 + torch.randint(0, 40, (B, Q, L), generator=g).float() * 2.0**-17
    return torch.randn(B, Q, L, generator=g) * 4.0  # both signs, several exponents, rare ties


def _positions(B: int, Q: int, L: int, g: torch.Generator) -> torch.Tensor:
    # a decode row near the end, a short history, position 0, and one past the scan (t >= L:
    # the whole row is visible and no self position)
    pos = torch.randint(0, L + 2, (B, Q), generator=g)
    pos[0, 0] = L - 1
    pos[-1, -1] = 0
    pos[1, 0] = L + 5
    return pos


pytestmark = interpreted(tk._topk_kernel)


@pytest.mark.parametrize(
    "B,Q,L,k,block,kind",
    [
        (3, 1, 1, 1, 16, "few"),
        (3, 4, 1, 8, 16, "randn"),
        (3, 4, 9, 1, 16, "few"),
        (3, 1, 9, 64, 16, "near"),  # k > L: everything visible, then -1
        (3, 1, 41, 8, 16, "few"),
        (3, 4, 41, 8, 16, "near"),
        (3, 1, 341, 64, 32, "few"),
        (3, 4, 341, 8, 64, "randn"),
        (3, 1, 200, 256, 32, "near"),  # k > L
        (3, 1, 1000, 64, 128, "near"),
        (3, 4, 1000, 8, 256, "few"),
    ],
)
def test_kernel_equals_reference(B, Q, L, k, block, kind):
    g = torch.Generator().manual_seed(L * 100 + k)
    scores = _scores(kind, B, Q, L, g)
    # beyond each query's position the scan holds padding: large values must not leak in
    pos = _positions(B, Q, L, g)
    future = torch.arange(L) > pos.unsqueeze(-1)
    scores = torch.where(future & (torch.rand(B, Q, L, generator=g) < 0.5), INF, scores)
    ref = tk.topk_positions(scores, pos, k, impl="reference")
    tri = tk.topk_positions_triton(scores, pos, k, block=block)
    assert tri.dtype == torch.int32 and tri.shape == (B, Q, k)
    assert torch.equal(tri, ref)


@pytest.mark.parametrize(
    "B,Q,L,k,kind",
    [
        (2, 1, 300, 16, "few"),  # exact ties across every segment: the lowest positions win
        (2, 2, 300, 40, "near"),  # the threshold in the low bits, ties across segments
        (2, 1, 257, 8, "randn"),
        (1, 3, 90, 64, "few"),  # k above a segment's length: segments keep all they have
    ],
)
def test_segments_do_not_change_the_result(B, Q, L, k, kind):
    """A row split into S segments (each keeps its top k in position order; a second launch
    selects among them) gives the reference's tensor for every S, so S may follow the batch."""
    g = torch.Generator().manual_seed(L + k)
    scores = _scores(kind, B, Q, L, g)
    pos = _positions(B, Q, L, g) if B > 1 else torch.randint(L // 2, L + 2, (B, Q), generator=g)
    ref = tk.topk_positions(scores, pos, k, impl="reference")
    for S in (1, 2, 5):
        assert torch.equal(tk.topk_positions_triton(scores, pos, k, block=32, segments=S), ref), S


def test_segment_rule():
    assert tk.topk_segments(49152, 1024, 1) == 6  # 8 x 1,024 positions per segment
    assert tk.topk_segments(49152, 1024, 32) == 4  # rows x segments near 128 programs
    assert tk.topk_segments(16384, 1024, 1) == 2 and tk.topk_segments(4000, 1024, 1) == 1
    assert tk.topk_segments(49152, 1024, 200) == 1


def test_rows_without_history_and_all_ties():
    """All -inf (only the own position survives), all equal (ties span every chunk: the lowest
    positions win), and a row entirely in the future of nobody (t past L, all -inf: all -1)."""
    L, k = 100, 24
    scores = torch.full((3, 2, L), -INF)
    scores[1] = 0.5
    scores[2, 1] = -0.0
    scores[2, 1, ::3] = 0.0
    pos = torch.tensor([[57, L + 3], [99, 40], [L + 1, 70]])
    ref = tk.topk_positions_reference(scores, pos, k)
    tri = tk.topk_positions_triton(scores, pos, k, block=16)
    assert torch.equal(tri, ref)
    assert tri[0, 0, 0] == 57 and (tri[0, 0, 1:] == -1).all() and (tri[0, 1] == -1).all()
    assert tri[1, 1].tolist() == [40] + list(range(23))


def test_the_own_position_outranks_inf_scores():
    """k or more +inf scores before the query's own position do not crowd it out: its key is
    above +inf's, in both implementations and with the row split into segments."""
    L, k = 40, 3
    scores = torch.randn(1, 2, L, generator=torch.Generator().manual_seed(3))
    scores[:, :, :4] = INF
    pos = torch.tensor([[8, 30]])
    ref = tk.topk_positions_reference(scores, pos, k)
    assert ref[0, :, 0].tolist() == [8, 30] and ref[0, :, 1:].tolist() == [[0, 1], [0, 1]]
    for segments in (1, 3):
        tri = tk.topk_positions_triton(scores, pos, k, block=16, segments=segments)
        assert torch.equal(tri, ref)


def test_dispatch_and_limits():
    s, p = torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long)
    assert torch.equal(
        tk.topk_positions(s, p, 2, impl="triton"), tk.topk_positions(s, p, 2, impl="reference")
    )
    with pytest.raises(ValueError, match="unknown top-k impl"):
        tk.topk_positions(s, p, 2, impl="sort")
    with pytest.raises(ValueError, match="k <= "):
        tk.topk_positions_triton(s, p, tk.MAX_K + 1)


_AOT = r"""
from systems.kernels import topk as tk
for v in (dict(), dict(KP=2, BLOCK=16, num_warps=4), dict(PARTS_OUT=True), dict(PARTS_IN=True)):
    k = tk.aot_compile(90, **v)
    assert "bar.sync" in k.asm["ptx"], v
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_kernel_compiles_for_sm90_without_gpu():
    run_compiled(_AOT)


def test_auto_selfcheck_covers_topk(monkeypatch):
    """A top-k kernel that differs from the reference sends model.attention_impl=auto to the
    references, with the reason."""
    from systems.kernels import selfcheck

    cpu = torch.device("cpu")  # (a passing check: test_index_scores' selfcheck test)
    monkeypatch.setattr(selfcheck, "_VERDICT", {})
    real = tk.topk_positions_triton
    monkeypatch.setattr(tk, "topk_positions_triton", lambda s, p, k: real(s, p, k).flip(-1))
    ok, why = selfcheck.check_kernels(cpu)
    assert not ok and "top-k positions differ" in why
