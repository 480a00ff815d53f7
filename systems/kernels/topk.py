"""The indexer's top-k: the k highest-scoring visible positions of each query, batch-invariant.

Contract
    scores     float32 [B, Q, L]   indexer scores over positions 0..L-1 (L: the batch's padded scan)
    positions  int     [B, Q]      each query's own position t: it sees 0..t and always selects t
    k          int
    returns    int32   [B, Q, k]   selected positions, highest score first; equal scores in
                                   ascending position order; -1 past the visible history

Why the tie rule matters: repeated prompt tokens give bit-equal scores (the indexer has no
positional term), and a sort-based top-k breaks such ties by where they sit in its input, which
depends on the batch's padded scan length L. Ranking by one 64-bit key per position, the
order-preserving integer image of the score in the high half and the complement of the position
in the low half, makes every key distinct: the selection and its order are then a function of
the query's own scores alone, whatever else runs in the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_LOW = (1 << 32) - 1


def ordered_keys(scores: torch.Tensor) -> torch.Tensor:
    """float32 [..., L] -> int64 [..., L]: key order = (score, then lower position) order."""
    s = scores.float() + 0.0  # -0.0 -> +0.0: equal scores, equal keys
    bits = s.view(torch.int32).to(torch.int64)
    # IEEE-754: positive floats order like their bits; negative ones in reverse
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    pos = torch.arange(scores.shape[-1], device=scores.device, dtype=torch.int64)
    return bits * (1 << 32) + (_LOW - pos)


def topk_positions_reference(scores: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    L = scores.shape[-1]
    ar = torch.arange(L, device=scores.device)
    pos = positions.unsqueeze(-1)
    scores = scores.masked_fill(ar > pos, float("-inf"))  # causal: the future is never selected
    scores = scores.masked_fill(ar == pos, float("inf"))  # the query's own row, always
    kk = min(k, L)
    _, idx = ordered_keys(scores).topk(kk, dim=-1)
    picked = scores.gather(-1, idx)
    idx = torch.where(picked == float("-inf"), -1, idx).to(torch.int32)
    if kk < k:
        idx = F.pad(idx, (0, k - kk), value=-1)
    return idx
