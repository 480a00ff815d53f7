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

Scores are finite or +-inf. NaN is outside the contract: a positive NaN ranks above +inf in
both implementations; the kernel never selects a negative NaN (the reference may, after -1s).

The Triton kernel (``topk_positions_triton``) is a radix select on the 32-bit score key, one
program per query row, and returns exactly the reference's int32 tensor:
    1. two 256-bin histogram passes over the row (tl.histogram) fix the top 16 bits of the k-th
       largest key (sign, exponent, 7 mantissa bits: few positions share them) and count the
       selectable positions; a row with at most k of them takes them all;
    2. a third pass writes the keys above that 16-bit threshold (all selected) to the row's
       winner scratch, and the positions on it (the candidates, ascending) to the candidate
       scratch, each compacted with a prefix sum;
    3. two more histogram passes, over the candidates only, fix the low 16 bits of the
       threshold key T and how many keys equal to T to take: the lowest positions, since the
       candidates are in ascending order; a last pass over them appends the winners;
    4. the winners, min(k, selectable), are sorted by the full 64-bit key (tl.sort on a
       power-of-two block) and written out, -1 after them.

Bytes moved: B*Q*L*4 (scores; the first pass reads them from HBM, the next two find the row in
L1 or L2) + B*Q*k*4 (out), plus scratch: 4 bytes per candidate written, then read with its score
three times (usually a small share of L; all of L when every score is equal), and 8 bytes per
winner. Scratch is sized by the shapes (B*Q*L int32 candidates, B*Q*next_pow2(k) int64
winners), never by the data, and the kernel makes no host sync: it captures in a CUDA graph.
Limits: 1 <= k <= MAX_K (the sort holds next_pow2(k) int64 keys in registers); L < 2**31.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - triton is a dependency; keep the reference usable
    _HAVE_TRITON = False

_LOW = (1 << 32) - 1
MAX_K = 4096
# Positions per block and warps per row. Not yet measured on the GPU (benchmarks/bench_topk.py
# --configs sweeps them): a large block means few serial HBM round trips when a batch-1 decode
# row runs alone on one SM; 4096 x 16 warps compiles to 102 registers, no spills (sm90).
BLOCK = 4096
NUM_WARPS = 16


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


if _HAVE_TRITON:
    # 32-bit score keys, signed order = float order (ordered_keys' high half)
    _KEY_INF = tl.constexpr(0x7F800000)  # +inf: the query's own position
    _KEY_NEG_INF = tl.constexpr(-0x7F800001)  # -inf: never selected
    _PAD = tl.constexpr(-(1 << 63))  # below every 64-bit key: sorts after the winners

    @triton.jit
    def _score_keys(srow, ll, n_vis, t):
        """Signed 32-bit keys of positions ll, and which of them are selectable."""
        return _keys(tl.load(srow + ll, mask=ll < n_vis, other=float("-inf")), ll, n_vis, t)

    @triton.jit
    def _keys(x, ll, n_vis, t):
        vis = ll < n_vis
        bits = x.to(tl.int32, bitcast=True)
        bits = tl.where(bits == -0x80000000, 0, bits)  # -0.0 -> +0.0, as ordered_keys does
        ks = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        ks = tl.where(ll == t, _KEY_INF, ks)
        return ks, vis & (ks > _KEY_NEG_INF)

    @triton.jit
    def _candidate_keys(srow, crow, ii, n_cand, n_vis, t):
        """Keys and positions of candidates ii (a gather from the row, which sits in L1/L2)."""
        m = ii < n_cand
        ll = tl.load(crow + ii, mask=m, other=0)
        ks, _ = _keys(tl.load(srow + ll, mask=m, other=0.0), ll, n_vis, t)
        return ks, ll, m

    @triton.jit
    def _full_key(ks, ll):
        """ordered_keys' 64-bit key: score key high, complement of the position low."""
        return (ks.to(tl.int64) << 32) + (4294967295 - ll.to(tl.int64))

    @triton.jit
    def _high16(ks):
        """The top 16 bits of the key as unsigned, in [0, 65536): bins in float order."""
        return ((ks >> 16) & 0xFFFF) ^ 0x8000

    @triton.jit
    def _threshold_digit(hist, r):
        """The bin holding the r-th largest key (r >= 1), and how many keys lie above it
        (r = 0, nothing left to take: the top bin, nothing above)."""
        bins = tl.arange(0, 256)
        at_or_above = tl.cumsum(hist, 0, reverse=True)  # keys in bins >= d, non-increasing
        d = tl.sum((at_or_above >= r).to(tl.int32)) - 1
        return d, tl.sum(tl.where(bins > d, hist, 0))

    @triton.jit
    def _topk_kernel(
        scores_ptr, pos_ptr, out_ptr, cand_ptr, sel_ptr, L, K, BLOCK: tl.constexpr, KP: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)  # b * Q + q
        t = tl.load(pos_ptr + row).to(tl.int32)
        n_vis = tl.maximum(tl.minimum(t + 1, L), 0)  # positions 0 .. n_vis-1 are visible
        srow = scores_ptr + row * L
        crow = cand_ptr + row * L
        wrow = sel_ptr + row * KP
        ar = tl.arange(0, BLOCK)

        # 1. the top 16 bits of the threshold key, from two histogram passes over the row:
        # p16 = the key's high half as unsigned (sign, exponent, 7 mantissa bits); a bin of
        # the second pass spans 1/128 of an octave, so few positions share the threshold's
        # (this pass reads the row from HBM, a round trip per block: the next block's load is
        # issued before this one's histogram; the later passes find the row in L1 or L2)
        hist = tl.zeros([256], dtype=tl.int32)
        x = tl.load(srow + ar, mask=ar < n_vis, other=float("-inf"))
        for start in range(0, n_vis, BLOCK):
            nxt = start + BLOCK + ar
            x_next = tl.load(srow + nxt, mask=nxt < n_vis, other=float("-inf"))
            ks, ok = _keys(x, start + ar, n_vis, t)
            hist += tl.histogram(_high16(ks) >> 8, 256, mask=ok)
            x = x_next
        n_ok = tl.sum(hist)
        T16 = n_ok * 0 - 1  # everything selectable fits in k: all are winners
        r = n_ok * 0  # how many keys equal to the threshold still to take
        if n_ok > K:
            d0, above = _threshold_digit(hist, K)
            r = K - above
            hist = tl.zeros([256], dtype=tl.int32)
            for start in range(0, n_vis, BLOCK):
                ks, ok = _score_keys(srow, start + ar, n_vis, t)
                p16 = _high16(ks)
                hist += tl.histogram(p16 & 0xFF, 256, mask=ok & ((p16 >> 8) == d0))
            d1, above = _threshold_digit(hist, r)
            r -= above
            T16 = d0 * 256 + d1

        # 2. keys above the 16-bit threshold -> winners (64-bit keys); keys on it -> candidates
        # (positions, ascending); one prefix sum ranks both (winners in its low 16 bits, so
        # BLOCK < 2**15 keeps the candidates' count below the sign bit)
        n_win = n_ok * 0
        n_cand = n_ok * 0
        for start in range(0, n_vis, BLOCK):
            ll = start + ar
            ks, ok = _score_keys(srow, ll, n_vis, t)
            p16 = _high16(ks)
            win = ok & (p16 > T16)
            cand = ok & (p16 == T16)
            rank = tl.cumsum(win.to(tl.int32) + (cand.to(tl.int32) << 16), 0)
            tl.store(wrow + n_win + (rank & 0xFFFF) - 1, _full_key(ks, ll), mask=win)
            tl.store(crow + n_cand + (rank >> 16) - 1, ll, mask=cand)
            n_win += tl.sum(win.to(tl.int32))
            n_cand += tl.sum(cand.to(tl.int32))
        tl.debug_barrier()  # the candidates were written by other threads of this program

        # 3. the low 16 bits of the threshold, 8 at a time, over the candidates only (all share
        # the top 16 bits, so their low bits order them)
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(0, n_cand, BLOCK):
            ks, ll, m = _candidate_keys(srow, crow, start + ar, n_cand, n_vis, t)
            hist += tl.histogram((ks >> 8) & 0xFF, 256, mask=m)
        d2, above = _threshold_digit(hist, r)
        r -= above
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(0, n_cand, BLOCK):
            ks, ll, m = _candidate_keys(srow, crow, start + ar, n_cand, n_vis, t)
            hist += tl.histogram(ks & 0xFF, 256, mask=m & (((ks >> 8) & 0xFF) == d2))
        d3, above = _threshold_digit(hist, r)
        r -= above
        T_lo = d2 * 256 + d3
        # candidates above the threshold are winners; of those on it, the first r (lowest
        # positions)
        n_eq = n_ok * 0
        for start in range(0, n_cand, BLOCK):
            ks, ll, m = _candidate_keys(srow, crow, start + ar, n_cand, n_vis, t)
            eq = m & ((ks & 0xFFFF) == T_lo)
            take = (m & ((ks & 0xFFFF) > T_lo)) | (eq & (n_eq + tl.cumsum(eq.to(tl.int32), 0) <= r))
            tl.store(
                wrow + n_win + tl.cumsum(take.to(tl.int32), 0) - 1, _full_key(ks, ll), mask=take
            )
            n_win += tl.sum(take.to(tl.int32))
            n_eq += tl.sum(eq.to(tl.int32))
        tl.debug_barrier()

        # 4. the n_win = min(k, selectable) winners in full-key order, then -1
        kk = tl.arange(0, KP)
        keys = tl.sort(tl.load(wrow + kk, mask=kk < n_win, other=_PAD), descending=True)
        picked = tl.where(kk < n_win, (4294967295 - (keys & 4294967295)).to(tl.int32), -1)
        tl.store(out_ptr + row * K + kk, picked, mask=kk < K)


def _p2(n: int) -> int:
    return 1 << max(1, (int(n) - 1).bit_length())


def topk_positions_triton(
    scores: torch.Tensor,
    positions: torch.Tensor,
    k: int,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Radix-select top-k (see the module docstring); bit-identical to the reference."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use impl='reference'")
    # pass 2 packs two prefix sums in one int32: winners below bit 16, candidates above
    assert block < 1 << 15
    if not 1 <= k <= MAX_K:
        raise ValueError(f"top-k needs 1 <= k <= {MAX_K}, got k={k}")
    B, Q, L = scores.shape
    assert positions.shape == (B, Q) and scores.dtype == torch.float32
    out = torch.empty((B, Q, k), dtype=torch.int32, device=scores.device)
    if B * Q == 0:
        return out
    kp = _p2(k)
    cand = torch.empty((B * Q, max(L, 1)), dtype=torch.int32, device=scores.device)
    sel = torch.empty((B * Q, kp), dtype=torch.int64, device=scores.device)
    _topk_kernel[(B * Q,)](
        scores.contiguous(),
        positions.contiguous(),
        out,
        cand,
        sel,
        L,
        k,
        BLOCK=block,
        KP=kp,
        num_warps=num_warps,
    )
    return out


def topk_positions(
    scores: torch.Tensor, positions: torch.Tensor, k: int, impl: str = "triton"
) -> torch.Tensor:
    """int32 [B, Q, k] top-k positions of each query (see the module docstring)."""
    if impl == "triton":
        return topk_positions_triton(scores, positions, k)
    if impl == "reference":
        return topk_positions_reference(scores, positions, k)
    raise ValueError(f"unknown top-k impl {impl!r}")


def aot_compile(arch: int = 90, num_warps: int = 8, **constexprs):
    """Compile for an NVIDIA target without a GPU (see resolver.aot_compile)."""
    from systems.kernels.aot import compile_for_nvidia

    c = dict(BLOCK=2048, KP=512)
    c.update(constexprs)
    ptrs = {
        "scores_ptr": "*fp32",
        "pos_ptr": "*i64",
        "out_ptr": "*i32",
        "cand_ptr": "*i32",
        "sel_ptr": "*i64",
    }
    return compile_for_nvidia(_topk_kernel, c, ptrs, arch, num_warps)
