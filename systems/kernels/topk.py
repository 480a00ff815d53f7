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

Scores are finite or +-inf. The query's own position ranks above every score, +inf included
(its 32-bit key is the largest int32, above +inf's), so it is selected whatever the others
score. NaN is outside the contract: a positive NaN ranks above +inf in both implementations
(and may tie with the own position's key); the kernel never selects a negative NaN (the
reference may, after -1s).

The Triton kernel (``topk_positions_triton``) is a radix select on the 32-bit score key. A
row runs as S segments (``topk_segments``; S = 1 for short rows or large batches), one program
each, then, where S > 1, one program per row over the segments' winners:
    1. two 256-bin histogram passes over the entries (tl.histogram) fix the top 16 bits of the
       k-th largest key (sign, exponent, 7 mantissa bits: few entries share them) and count the
       selectable entries; at most k of them are all taken;
    2. a third pass writes the entries on that 16-bit threshold (the candidates, ascending) to
       the candidate scratch with a prefix sum (and, in the last stage, the keys above it, all
       selected, to the row's winner scratch);
    3. two more histogram passes, over the candidates only, fix the low 16 bits of the
       threshold key T and how many keys equal to T to take: the lowest positions, since the
       entries are in ascending position order;
    4. a segment writes its winners (key, position) in position order, sentinels after them
       (a fourth pass over the segment); the last stage sorts its min(k, selectable) winners by
       the full 64-bit key (tl.sort on a power-of-two block) and writes them, -1 after them.
The second stage's entries are the segments' winners in segment order, so they are in
ascending position order too, and the top k of a row are the top k of its segments' top k:
every S gives the reference's tensor.

Bytes moved: B*Q*L*4 (scores; the first pass reads them from HBM, the next ones find them in
L1 or L2) + B*Q*k*4 (out), plus scratch: 4 bytes per candidate written, then read with its score
three times (usually a small share of L; all of L when every score is equal), 8 bytes per
segment winner written and read once, and 8 bytes per final winner. Scratch is sized by the
shapes (B*Q*max(L, S*k) int32 candidates, B*Q*S*next_pow2(k) segment winners, B*Q*next_pow2(k)
int64 winners), never by the data, and the kernel makes no host sync: it captures in a CUDA
graph. Limits: 1 <= k <= MAX_K (the sort holds next_pow2(k) int64 keys in registers);
L < 2**31.
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
# the own position's 32-bit score key: above +inf's (0x7F800000), so k or more +inf scores cannot
# crowd a query out of its own selection
OWN_KEY = 0x7FFFFFFF
MAX_K = 4096
# Positions per block and warps per program. Measured on the H200 with segments
# (results/kernels/topk-h200-segments.json, CUDA-graph replays): 2,048 x 8 warps took 65 / 83 us
# at L = 49,152, k = 1,024, batch 1 / 32 (4,096 x 16: 74 / 79 us; one program per row: 135) and
# 39 us at L = 16,384, k = 512 (4,096 x 16: 49 us).
BLOCK = 2048
NUM_WARPS = 8


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
    keys = ordered_keys(scores)
    own = OWN_KEY * (1 << 32) + (_LOW - ar)  # above every score's key, +inf's included
    keys = torch.where(ar == pos, own, keys)
    kk = min(k, L)
    _, idx = keys.topk(kk, dim=-1)
    picked = scores.gather(-1, idx)
    idx = torch.where(picked == float("-inf"), -1, idx).to(torch.int32)
    if kk < k:
        idx = F.pad(idx, (0, k - kk), value=-1)
    return idx


if _HAVE_TRITON:
    # 32-bit score keys, signed order = float order (ordered_keys' high half)
    _KEY_OWN = tl.constexpr(OWN_KEY)  # the query's own position: above +inf
    _KEY_NEG_INF = tl.constexpr(-0x7F800001)  # -inf: never selected
    _PAD = tl.constexpr(-(1 << 63))  # below every 64-bit key: sorts after the winners

    @triton.jit
    def _keys(x, ll, n_vis, t):
        vis = ll < n_vis
        bits = x.to(tl.int32, bitcast=True)
        bits = tl.where(bits == -0x80000000, 0, bits)  # -0.0 -> +0.0, as ordered_keys does
        ks = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        ks = tl.where(ll == t, _KEY_OWN, ks)
        return ks, vis & (ks > _KEY_NEG_INF)

    @triton.jit
    def _entry_keys(srow, prow, ll, hi, t, PARTS_IN: tl.constexpr):
        """Keys, positions and selectability of entries ll (< hi) of a row: the scores'
        positions, or (PARTS_IN) the segments' winners, stored as (key, position)."""
        if PARTS_IN:
            m = ll < hi
            ks = tl.load(srow + ll, mask=m, other=_KEY_NEG_INF)
            return ks, tl.load(prow + ll, mask=m, other=-1), m & (ks > _KEY_NEG_INF)
        else:
            ks, ok = _keys(tl.load(srow + ll, mask=ll < hi, other=float("-inf")), ll, hi, t)
            return ks, ll, ok

    @triton.jit
    def _candidate_keys(srow, prow, crow, ii, n_cand, hi, t, PARTS_IN: tl.constexpr):
        """Keys and positions of candidates ii (a gather from the row, which sits in L1/L2)."""
        m = ii < n_cand
        ll = tl.load(crow + ii, mask=m, other=0)
        ks, pos, _ = _entry_keys(srow, prow, ll, hi, t, PARTS_IN)
        return ks, pos, m

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
        src_ptr,
        psrc_ptr,
        pos_ptr,
        out_ptr,
        okey_ptr,
        cand_ptr,
        sel_ptr,
        L,
        SEG,
        K,
        cand_stride,
        BLOCK: tl.constexpr,
        KP: tl.constexpr,
        PARTS_IN: tl.constexpr,
        PARTS_OUT: tl.constexpr,
    ):
        """Program (row, segment): the top K of the row's entries lo .. hi-1.
        Scores in (PARTS_IN false): entries are positions, segment s covers s*SEG ..; parts in:
        entries are the L = S*KP stored winners of a row's S segments, in ascending position
        order (so equal keys still go to the lowest positions), one segment.
        Parts out: the winners are written in ascending position order as (key, position),
        then sentinels (-inf key, position -1) up to KP; else sorted by the full key, then -1."""
        row = tl.program_id(0).to(tl.int64)  # b * Q + q
        s = tl.program_id(1)
        if PARTS_IN:
            t = -1  # the own position's key was made +inf by the first stage
            lo = 0
            hi = L
        else:
            t = tl.load(pos_ptr + row).to(tl.int32)
            n_vis = tl.maximum(tl.minimum(t + 1, L), 0)  # positions 0 .. n_vis-1 are visible
            lo = s * SEG
            hi = tl.minimum(lo + SEG, n_vis)
        srow = src_ptr + row * L
        prow = psrc_ptr + row * L
        crow = cand_ptr + row * cand_stride + lo  # a segment's candidates: at most its length
        wrow = sel_ptr + row * KP
        ar = tl.arange(0, BLOCK)

        # 1. the top 16 bits of the threshold key, from two histogram passes over the entries:
        # p16 = the key's high half as unsigned (sign, exponent, 7 mantissa bits); a bin of
        # the second pass spans 1/128 of an octave, so few entries share the threshold's (the
        # first pass reads the entries from HBM; the later passes find them in L1 or L2)
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(lo, hi, BLOCK):
            ks, _, ok = _entry_keys(srow, prow, start + ar, hi, t, PARTS_IN)
            hist += tl.histogram(_high16(ks) >> 8, 256, mask=ok)
        n_ok = tl.sum(hist)
        T16 = n_ok * 0 - 1  # everything selectable fits in k: all are winners
        r = n_ok * 0  # how many keys equal to the threshold still to take
        if n_ok > K:
            d0, above = _threshold_digit(hist, K)
            r = K - above
            hist = tl.zeros([256], dtype=tl.int32)
            for start in range(lo, hi, BLOCK):
                ks, _, ok = _entry_keys(srow, prow, start + ar, hi, t, PARTS_IN)
                p16 = _high16(ks)
                hist += tl.histogram(p16 & 0xFF, 256, mask=ok & ((p16 >> 8) == d0))
            d1, above = _threshold_digit(hist, r)
            r -= above
            T16 = d0 * 256 + d1

        # 2. entries on the 16-bit threshold -> candidates (entry indices, ascending); unless
        # the winners go out in position order, entries above it -> winners (64-bit keys). One
        # prefix sum ranks both (winners in its low 16 bits, so BLOCK < 2**15 keeps the
        # candidates' count below the sign bit)
        n_win = n_ok * 0
        n_cand = n_ok * 0
        for start in range(lo, hi, BLOCK):
            ll = start + ar
            ks, pos, ok = _entry_keys(srow, prow, ll, hi, t, PARTS_IN)
            p16 = _high16(ks)
            win = ok & (p16 > T16)
            cand = ok & (p16 == T16)
            rank = tl.cumsum(win.to(tl.int32) + (cand.to(tl.int32) << 16), 0)
            if not PARTS_OUT:
                tl.store(wrow + n_win + (rank & 0xFFFF) - 1, _full_key(ks, pos), mask=win)
            tl.store(crow + n_cand + (rank >> 16) - 1, ll, mask=cand)
            n_win += tl.sum(win.to(tl.int32))
            n_cand += tl.sum(cand.to(tl.int32))
        tl.debug_barrier()  # the candidates were written by other threads of this program

        # 3. the low 16 bits of the threshold, 8 at a time, over the candidates only (all share
        # the top 16 bits, so their low bits order them)
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(0, n_cand, BLOCK):
            ks, _, m = _candidate_keys(srow, prow, crow, start + ar, n_cand, hi, t, PARTS_IN)
            hist += tl.histogram((ks >> 8) & 0xFF, 256, mask=m)
        d2, above = _threshold_digit(hist, r)
        r -= above
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(0, n_cand, BLOCK):
            ks, _, m = _candidate_keys(srow, prow, crow, start + ar, n_cand, hi, t, PARTS_IN)
            hist += tl.histogram(ks & 0xFF, 256, mask=m & (((ks >> 8) & 0xFF) == d2))
        d3, above = _threshold_digit(hist, r)
        r -= above
        T_lo = d2 * 256 + d3

        if PARTS_OUT:
            # 4a. the segment's winners in ascending position order: keys above the threshold
            # (T16, T_lo), and of those on it the first r; sentinels after them
            orow = okey_ptr + (row * tl.num_programs(1) + s) * KP
            prow_out = out_ptr + (row * tl.num_programs(1) + s) * KP
            n_take = n_ok * 0
            n_eq = n_ok * 0
            for start in range(lo, hi, BLOCK):
                ks, pos, ok = _entry_keys(srow, prow, start + ar, hi, t, PARTS_IN)
                p16 = _high16(ks)
                on = ok & (p16 == T16)
                eq = on & ((ks & 0xFFFF) == T_lo)
                take = (ok & (p16 > T16)) | (on & ((ks & 0xFFFF) > T_lo))
                take = take | (eq & (n_eq + tl.cumsum(eq.to(tl.int32), 0) <= r))
                at = n_take + tl.cumsum(take.to(tl.int32), 0) - 1
                tl.store(orow + at, ks, mask=take)
                tl.store(prow_out + at, pos.to(tl.int32), mask=take)
                n_take += tl.sum(take.to(tl.int32))
                n_eq += tl.sum(eq.to(tl.int32))
            kk = tl.arange(0, KP)
            rest = kk >= n_take
            tl.store(orow + kk, tl.full([KP], _KEY_NEG_INF, tl.int32), mask=rest)
            tl.store(prow_out + kk, tl.full([KP], -1, tl.int32), mask=rest)
        else:
            # 4b. candidates above the threshold are winners; of those on it, the first r
            # (lowest positions)
            n_eq = n_ok * 0
            for start in range(0, n_cand, BLOCK):
                ks, pos, m = _candidate_keys(srow, prow, crow, start + ar, n_cand, hi, t, PARTS_IN)
                eq = m & ((ks & 0xFFFF) == T_lo)
                take = (m & ((ks & 0xFFFF) > T_lo)) | (
                    eq & (n_eq + tl.cumsum(eq.to(tl.int32), 0) <= r)
                )
                tl.store(
                    wrow + n_win + tl.cumsum(take.to(tl.int32), 0) - 1,
                    _full_key(ks, pos),
                    mask=take,
                )
                n_win += tl.sum(take.to(tl.int32))
                n_eq += tl.sum(eq.to(tl.int32))
            tl.debug_barrier()

            # 5. the n_win = min(k, selectable) winners in full-key order, then -1
            kk = tl.arange(0, KP)
            keys = tl.sort(tl.load(wrow + kk, mask=kk < n_win, other=_PAD), descending=True)
            picked = tl.where(kk < n_win, (4294967295 - (keys & 4294967295)).to(tl.int32), -1)
            tl.store(out_ptr + row * K + kk, picked, mask=kk < K)


def _p2(n: int) -> int:
    return 1 << max(1, (int(n) - 1).bit_length())


# Segments: a row of L positions runs as S programs of about L / S positions each, which keep
# their own top k (in position order), and a second launch selects the top k of those S k
# winners. One program per row leaves a batch-1 step's top-k on one SM, a serial pass over 49K
# positions per histogram (133 us on the H200 at L = 49,152, k = 1,024:
# results/kernels/topk-h200-49k.json). The segmentation does not change the result (the top k
# of a row by a total order are the top k of its segments' top k), so S may follow the batch.
# A segment holds at least SEG_PER_K x next_pow2(k) positions (the first stage then drops at
# least 7/8 of them) and S x rows stays near FILL_PROGRAMS (the H200's 132 SMs).
SEG_PER_K = 8
FILL_PROGRAMS = 128


def topk_segments(L: int, k: int, rows: int) -> int:
    """Segments per row for a launch of ``rows`` rows of ``L`` positions (1: one stage)."""
    by_len = int(L) // (SEG_PER_K * _p2(k))
    return max(1, min(by_len, FILL_PROGRAMS // max(int(rows), 1)))


def topk_positions_triton(
    scores: torch.Tensor,
    positions: torch.Tensor,
    k: int,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
    segments: int | None = None,
) -> torch.Tensor:
    """Radix-select top-k (see the module docstring); bit-identical to the reference whatever
    ``segments`` (None: ``topk_segments``)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use impl='reference'")
    # pass 2 packs two prefix sums in one int32: winners below bit 16, candidates above
    assert block < 1 << 15
    if not 1 <= k <= MAX_K:
        raise ValueError(f"top-k needs 1 <= k <= {MAX_K}, got k={k}")
    B, Q, L = scores.shape
    assert positions.shape == (B, Q) and scores.dtype == torch.float32
    out = torch.empty((B, Q, k), dtype=torch.int32, device=scores.device)
    rows = B * Q
    if rows == 0:
        return out
    kp = _p2(k)
    S = topk_segments(L, k, rows) if segments is None else max(1, int(segments))
    seg = -(-max(L, 1) // S)
    dev = scores.device
    scores, positions = scores.contiguous(), positions.contiguous()
    width = max(L, 1, S * kp if S > 1 else 0)
    cand = torch.empty((rows, width), dtype=torch.int32, device=dev)
    sel = torch.empty((rows, kp), dtype=torch.int64, device=dev)
    meta = dict(BLOCK=block, KP=kp, num_warps=num_warps)
    if S == 1:
        _topk_kernel[(rows, 1)](
            scores, scores, positions, out, out, cand, sel, L, seg, k, width,
            PARTS_IN=False, PARTS_OUT=False, **meta,
        )  # fmt: skip
        return out
    # stage 1: each segment's winners as (key, position) in position order; stage 2: their top k
    keys = torch.empty((rows, S * kp), dtype=torch.int32, device=dev)
    pos = torch.empty((rows, S * kp), dtype=torch.int32, device=dev)
    _topk_kernel[(rows, S)](
        scores, scores, positions, pos, keys, cand, sel, L, seg, k, width,
        PARTS_IN=False, PARTS_OUT=True, **meta,
    )  # fmt: skip
    _topk_kernel[(rows, 1)](
        keys, pos, positions, out, out, cand, sel, S * kp, S * kp, k, width,
        PARTS_IN=True, PARTS_OUT=False, **meta,
    )  # fmt: skip
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

    c = dict(BLOCK=2048, KP=512, PARTS_IN=False, PARTS_OUT=False)
    c.update(constexprs)
    src = "*i32" if c["PARTS_IN"] else "*fp32"
    ptrs = {
        "src_ptr": src,
        "psrc_ptr": "*i32" if c["PARTS_IN"] else src,
        "pos_ptr": "*i64",
        "out_ptr": "*i32",
        "okey_ptr": "*i32",
        "cand_ptr": "*i32",
        "sel_ptr": "*i64",
    }
    return compile_for_nvidia(_topk_kernel, c, ptrs, arch, num_warps)
