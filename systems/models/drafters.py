"""Drafters for speculative decoding, with random seeded weights like the target.

Both share the target's embedding and LM head (as DFlash/EAGLE-style drafters do), keep their own
small transformer whose KV lives in a window-bounded ring (systems/spec/ring.py), and condition on
target hidden features of committed positions.

- ``DFlash2Drafter``: extends the anchor into a block of K-1 proposals in ONE parallel pass: the
  block is [anchor, mask, mask, ...]; block position j proposes the token at n + j + 1.
- ``DSparkDrafter``: a lightweight sequential head: proposals one at a time, each with a
  confidence (its probability); a scheduler picks each request's verification prefix K_r.

Committed positions are "caught up" into the ring with their real tokens and the target hidden
state of that position; block positions are never written to the ring (tentative state).
Shape legend: B requests, L positions, d drafter width, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from systems.engine.sampler import draw
from systems.kernels.gemm import mm
from systems.kernels.ring_attention import ring_attention
from systems.spec.ring import DraftRing


class _DraftCore(torch.nn.Module):
    # propose / catch_up do device work only (given ``sampled`` from the host): the speculative
    # decoder may capture them in CUDA graphs (systems/engine/cuda_graph.py)
    graph_capturable = True

    def __init__(
        self,
        target,
        num_layers: int,
        dim: int,
        window: int,
        num_slots: int,
        page: int,
        k_max: int,
        seed: int,
    ):
        super().__init__()
        cfg = target.cfg
        self.target = target
        self.dim = dim
        self.num_layers = num_layers
        self.window = window
        self.k_max = k_max
        dev, dt = target.device, target.dtype
        g = torch.Generator().manual_seed(seed + 7919)

        def w(*shape):
            return (torch.randn(*shape, generator=g) / math.sqrt(shape[0])).to(dev, dt)

        D = cfg.hidden_size
        self.w_in = w(D, dim)
        self.w_hid = w(D, dim)
        self.mask_emb = (torch.randn(dim, generator=g) * 0.1).to(dev, dt)
        self.layers = [
            {
                "wq": w(dim, dim),
                "wk": w(dim, dim),
                "wv": w(dim, dim),
                "wo": w(dim, dim),
                "w1": w(dim, 2 * dim),
                "w2": w(2 * dim, dim),
            }
            for _ in range(num_layers)
        ]
        self.w_out = w(dim, D)
        self.ring = DraftRing(num_layers, dim, num_slots, window, page, k_max, dev, dt)
        self.scale = 1.0 / math.sqrt(dim)
        # the ring attention kernel wherever the target's kernels run (its reference gathers the
        # slots' rings and calls SDPA: one program per request at the drafter's single head)
        impl = getattr(target, "attention_impl", "reference")
        self.attn_impl = "triton" if impl.startswith("triton") else "reference"

    @property
    def fixed_bytes(self) -> int:
        weights = sum(t.numel() * t.element_size() for l in self.layers for t in l.values())
        weights += sum(t.numel() * t.element_size() for t in (self.w_in, self.w_hid, self.w_out))
        return weights + self.ring.nbytes

    def _mm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """A projection, through the target's GEMM (``model.gemm_impl``)."""
        return mm(x, w, self.target.gemm_impl)

    @staticmethod
    def _norm(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._mm(self.target.embed[tokens.long()], self.w_in)

    def catch_up(
        self,
        slots: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        valid: torch.Tensor,
    ) -> None:
        """Write ring KV for committed positions, which attend to the slots' ring windows
        before them and to the chunk causally. tokens/positions/valid (B, L); hidden (B, L, D).
        Rows where valid is False are not written."""
        rows = self.ring.rows(slots, positions).reshape(-1)
        # rows of invalid entries keep their contents: a masked write instead of boolean
        # indexing, which would sync (the rows of one call are distinct: L <= ring size)
        keep = ~valid.reshape(-1, 1)
        ctx = self._context(slots, positions[:, :1], tokens.shape[1], True)
        for li, (k, v) in enumerate(self._chunk_kv(tokens, hidden, ctx)):
            for j, new in ((0, k), (1, v)):
                ring = self.ring.kv[li, j]
                ring[rows] = torch.where(keep, ring[rows], new.reshape(-1, self.dim))

    def prompt_kv(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The ring KV of a prompt's last L positions, tokens (L,) and target features (L, D),
        attending to themselves alone (a new request has no ring history): (layers, 2, L, d),
        for ``DraftRing.write``. It depends on the prompt only, so a prefill computes it once
        for every request of that prompt, at batch 1 (the same bytes whatever else arrives)."""
        kv = [torch.stack((k[0], v[0])) for k, v in self._chunk_kv(tokens[None], hidden[None])]
        return torch.stack(kv)

    def _chunk_kv(self, tokens: torch.Tensor, hidden: torch.Tensor, ctx=None):
        """Each layer's (k, v), (B, L, d), of a chunk of committed positions: tokens (B, L),
        hidden (B, L, D), attending to ``ctx`` (``_context``) or, None, to the chunk alone. A
        layer's keys are yielded after its attention has read the ring, so a caller writing
        them reads what a read-then-write would; the last layer's attention and MLP feed
        nothing the ring keeps, and are skipped."""
        x = self._embed(tokens) + self._mm(hidden.to(self.w_hid.dtype), self.w_hid)
        last = len(self.layers) - 1
        for li in range(len(self.layers)):
            k, v, x = self._layer(li, x, ctx, out=li < last)
            yield k, v

    def _layer(self, li: int, x: torch.Tensor, ctx, out: bool = True):
        """Layer ``li`` over x (B, L, d): its keys and values, and with ``out`` x after it
        (attention over ``ctx`` and the chunk, then the MLP); else x as it came."""
        p = self.layers[li]
        h = self._norm(x)
        k, v = self._mm(h, p["wk"]), self._mm(h, p["wv"])
        if out:
            x = x + self._attend(p, h, k, v, ctx, li)
            x = x + self._mm(F.silu(self._mm(self._norm(x), p["w1"])), p["w2"])
        return k, v, x

    def _context(self, slots: torch.Tensor, first_pos: torch.Tensor, L: int, causal_block: bool):
        """What a block of L queries starting at first_pos (B, 1) attends to: each slot's whole
        ring, then the block's own keys. Returns (slots, bias): bias (B, 1, L, R_d + L) is an
        additive mask in the model dtype, 0 where a query may attend (the ring rows of the W
        positions before first_pos; the block's keys, up to itself when causal), -inf elsewhere.

        Row j of a slot holds the latest position t < first_pos with t = j (mod R_d) (eq. 10;
        block positions are never written), and R_d > W, so the rows whose t lies in
        [first_pos - W, first_pos) are exactly the window. Reading the slot's rows as one
        contiguous block and masking the rest replaces a gather of W scattered rows. The mask
        is built once per call for every layer, as a view of rows padded to a multiple of 8
        elements: the fused attention kernels read it in place only with aligned rows."""
        r_d = self.ring.r_d
        dev = first_pos.device
        j = torch.arange(r_d, device=dev)
        last = first_pos - 1  # (B, 1)
        t = last - torch.remainder(last - j, r_d)  # (B, R_d): the position row j holds
        ok = (t >= first_pos - self.window) & (t >= 0)
        blk = torch.ones(L, L, dtype=torch.bool, device=dev)
        if causal_block:
            blk = blk.tril()
        B, M = ok.shape[0], r_d + L
        allowed = torch.cat([ok.unsqueeze(1).expand(-1, L, -1), blk.expand(B, -1, -1)], dim=-1)
        bias = torch.full(
            (B, 1, L, -(-M // 8) * 8), float("-inf"), dtype=self.ring.kv.dtype, device=dev
        )
        bias = bias[..., :M]
        bias.masked_fill_(allowed.unsqueeze(1), 0.0)
        return slots.long(), bias

    def _attend(self, p, h, k, v, ctx, li):
        """h, k, v (B, L, d): block queries attend to their ring window and block keys (ctx from
        ``_context``; systems/kernels/ring_attention.py reads the rings in place), or with ctx
        None to the block's keys causally: one fused attention call in the model dtype. (A block
        padded at the end stays exact: no valid query sees a pad.)"""
        q = self._mm(h, p["wq"])
        if ctx is None:
            out = F.scaled_dot_product_attention(
                q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), is_causal=True, scale=self.scale
            )[:, 0]
            return self._mm(out, p["wo"])
        slots, bias = ctx
        ring = self.ring.kv[li].view(2, -1, self.ring.r_d, h.shape[-1])  # the padding slot's too
        out = ring_attention(q, ring[0], ring[1], slots, k, v, bias, self.scale, self.attn_impl)
        return self._mm(out, p["wo"])

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._mm(self._mm(self._norm(x), self.w_out), self.target.lm_head).float()


class DFlash2Drafter(_DraftCore):
    """Parallel block drafter: one pass proposes K-1 tokens."""

    name = "dflash2"
    # each block position's token is drawn from that pass's q alone (no draft feeds another),
    # so sampled drafting is the greedy pass plus ``redraw``
    draws_after_pass = True

    def propose(
        self,
        slots: torch.Tensor,
        anchors: torch.Tensor,
        n: torch.Tensor,
        K: int,
        temperatures: torch.Tensor,
        gen: torch.Generator | None,
        sampled: bool | None = None,
    ):
        """anchors (B,), n (B,) anchor positions -> proposals (B, K-1), q probs (B, K-1, V).
        ``sampled``: whether any temperature is > 0, if the caller knows (else a device sync)."""
        B = anchors.shape[0]
        x = torch.cat(
            [self._embed(anchors).unsqueeze(1), self.mask_emb.expand(B, K - 1, -1)], dim=1
        )  # (B, K, d)
        ctx = self._context(slots, n.unsqueeze(1), K, causal_block=False)  # bidirectional block
        for li in range(len(self.layers)):
            x = self._layer(li, x, ctx)[2]
        logits = self._logits(x[:, : K - 1])  # block position j proposes token n + j + 1
        return _draw(logits, temperatures, gen, sampled)


class DSparkDrafter(_DraftCore):
    """Sequential head with per-token confidence; the scheduler picks K_r per request."""

    name = "dspark"

    def propose(self, slots, anchors, n, K, temperatures, gen, sampled=None):
        toks = [anchors]
        xs = []
        props, probs, confs = [], [], []
        for j in range(K - 1):
            xs.append(self._embed(toks[-1]).unsqueeze(1))
            x = torch.cat(xs, dim=1)  # (B, j+1, d): recompute the short block (K <= 8)
            ctx = self._context(slots, n.unsqueeze(1), j + 1, causal_block=True)
            for li in range(len(self.layers)):
                x = self._layer(li, x, ctx)[2]
            logits = self._logits(x[:, -1:])
            t, q = _draw(logits, temperatures, gen, sampled)
            toks.append(t[:, 0])
            props.append(t)
            probs.append(q)
            confs.append(torch.softmax(logits.float(), -1).gather(-1, t.unsqueeze(-1))[..., 0])
        self.last_confidence = torch.cat(confs, 1)  # (B, K-1): the head's own probabilities
        return torch.cat(props, 1), torch.cat(probs, 1)


def _draw(logits: torch.Tensor, temperatures: torch.Tensor, gen, sampled: bool | None = None):
    """logits (B, L, V) -> (tokens (B, L), q (B, L, V)): the distribution tokens were drawn from.
    Temperature 0 is a point mass on the argmax (greedy drafting). ``sampled``: whether any
    temperature is > 0 (None: ask the device)."""
    greedy = logits.argmax(-1)
    t = temperatures.view(-1, 1, 1)
    q_soft = torch.softmax(logits / t.clamp_min(1e-5), dim=-1)
    # a scatter, not F.one_hot: one_hot checks its indices on the host (a sync per round)
    onehot = torch.zeros_like(q_soft).scatter_(-1, greedy.unsqueeze(-1), 1.0)
    q = torch.where(t > 0, q_soft, onehot)
    if sampled is None:
        sampled = bool((temperatures > 0).any())
    return (redraw(greedy, q, temperatures, gen) if sampled else greedy), q


def redraw(greedy: torch.Tensor, q: torch.Tensor, temperatures: torch.Tensor, gen) -> torch.Tensor:
    """Draws (B, L) from ``q`` (``_draw``'s distribution) for the rows that sample, the greedy
    tokens elsewhere. A drafter whose positions are drawn independently given one pass
    (``draws_after_pass``) runs that pass greedily in its CUDA graph and draws here after it."""
    return draw(q, greedy, temperatures, gen)


DRAFTERS = {"dflash2": DFlash2Drafter, "dspark": DSparkDrafter}
