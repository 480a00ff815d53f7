"""A sparse-attention transformer with an indexer, random seeded weights, and pluggable KV storage.

The model never touches KV storage directly. It talks to a ``KVContext`` (prefill buffer or a KV
backend through the model runner) with a few verbs: write a row, write index keys, score the
visible index keys, locate (or gather) selected rows. That is the seam where the paper's KV
policies plug in.

Shape legend: B requests, Q queries per request (1 for decode, K for verification, T for prefill),
k selected rows, L visible history, D hidden, H heads, d kv_dim, di index_dim.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from profiling.ranges import ATTEND, MLP, PROJ, SELECT, nvtx_range
from systems.disk_cache import load_or_draw
from systems.kernels.fused_ops import add_rms_norm, blend_index_query, encode_fp8_rows, silu_mul
from systems.kernels.gemm import mm
from systems.kernels.selfcheck import resolve_impl
from systems.kernels.sparse_attention import sparse_attention
from systems.kernels.topk import topk_positions
from systems.models.config import LayerSpec, ModelConfig
from systems.models.kv_format import decode_rows, encode_rows


class KVContext(Protocol):
    def write_kv(self, source: int, rows: torch.Tensor) -> None:
        """rows: (B, Q, row_bytes) uint8, the new rows of the Q query positions."""

    def kv_write_target(self, source: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(buffer (M, row_bytes) uint8, rows (B * Q,)): where this step's new rows of
        ``source`` go, for a model that encodes them in place; None when the context must see
        the rows themselves (``write_kv``). Every row must be a valid row of the buffer: the
        kernel writing there does not check (an indexed write would have raised)."""

    def write_index(self, source: int, keys: torch.Tensor) -> None:
        """keys: (B, Q, di), index keys of the Q query positions."""

    def index_scores(self, source: int, iq: torch.Tensor) -> torch.Tensor:
        """(B, Qc, L) float32: iq (B, Qc, di) . the index key of every visible position
        (L >= max position + 1), float32 products; a backend may compute it without
        materializing the keys (systems/kernels/index_scores.py)."""

    def locate(
        self, layer: LayerSpec, selections: torch.Tensor, q0: int, inherit: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """selections: (B, Qc, k) positions (-1 padding) of queries q0..q0+Qc-1.
        Returns (buffer (M, row_bytes) uint8, locations (B, Qc, k)): the row of each selection
        (anything where the selection is -1). ``inherit``: the layer reuses the latest
        selection on its source, so the context may reuse that call's locations instead of
        resolving again."""

    def gather(
        self, layer: LayerSpec, selections: torch.Tensor, q0: int, inherit: bool
    ) -> torch.Tensor:
        """The rows themselves: ``buffer[locations]``, (B, Qc, k, row_bytes) uint8."""

    def verified_queries(self) -> torch.Tensor | None:
        """(B, Q) bool: the queries whose selections count, or None when all of them do. A
        verification pass runs the batch's widest prefix; eq. 6's union is over each
        request's own K_r queries, so the model lets a query past them select its own row
        only (in the tail: nothing to fetch, stage or scan; its output is never accepted)."""


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except OSError:  # no source shipped: the bytecode stands for it
        return repr(fn.__code__.co_code)


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _weight_fields(c: ModelConfig) -> tuple:
    """What the drawn weights depend on besides the drawing code and the dtype."""
    roles = tuple((s.writes_source, s.role, s.selects) for s in c.layers)
    dims = (c.hidden_size, c.intermediate_size, c.num_heads, c.kv_dim, c.index_dim)
    return (*dims, c.vocab_size, c.seed, roles)


def weight_cache_key(cfg: ModelConfig, dtype: torch.dtype) -> str:
    """The weight cache's key (systems/disk_cache.py): the drawing code, the fields the draw
    reads, the dtype and torch's version (its CPU generator's stream is not promised across
    releases)."""
    return repr((_source(SparseModel._draw_weights), _weight_fields(cfg), dtype, torch.__version__))


def predraw(cfg: ModelConfig) -> tuple[Path, bool]:
    """Draw ``cfg``'s weights on the CPU into DHS_WEIGHT_CACHE, the file a server on any
    device loads (the draw is the CPU generator's on every device, the dtype ``cfg``'s): a GPU
    batch draws a large preset beside runs of another, and that preset's first server then
    starts in seconds, not minutes (dsv41_h200's 30 GB).
    (the file, whether it was drawn now rather than found)."""
    from types import SimpleNamespace

    from systems.disk_cache import WEIGHTS_ENV, cache_path, save

    dtype = _dtype(cfg.dtype)
    path = cache_path(weight_cache_key(cfg, dtype), WEIGHTS_ENV, "weights")
    if path is None:
        raise ValueError(f"predraw: set {WEIGHTS_ENV} to the weight cache's directory")
    if path.exists():
        return path, False
    drawer = SimpleNamespace(cfg=cfg, specs=cfg.layers, device=torch.device("cpu"), dtype=dtype)
    save(SparseModel._draw_weights(drawer), path, "weights")
    if not path.exists():  # save() logs why (too little disk, another writer) and goes on
        raise RuntimeError(f"predraw: the weights were drawn but not saved to {path}")
    return path, True


class SparseModel(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, device: torch.device | str = "cpu"):
        super().__init__()
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = _dtype(cfg.dtype)
        self.specs = cfg.layers
        # "auto": the fused Triton kernel on a GPU, the PyTorch reference elsewhere (the golden
        # tokens are the reference's; backends agree bit for bit under either;
        # and fall back to the reference if the kernels fail a self-check on this GPU)
        self.attention_impl = resolve_impl(cfg.attention_impl, self.device)
        # the indexer's top-k follows: the radix-select kernel wherever the kernels run
        self.topk_impl = "triton" if self.attention_impl.startswith("triton") else "reference"
        # and so do the layer's small fused kernels (norms, SiLU product, fp8 row encoding)
        # with the concatenated projection weights they come with
        self.fused = self.topk_impl == "triton"
        self.norm_impl = self.topk_impl
        self.gemm_impl = cfg.gemm_impl
        # drawn once per set of weights when DHS_WEIGHT_CACHE is set (systems/disk_cache.py)
        # torch's version too: its CPU generator's stream is not promised across releases
        drawn = load_or_draw(weight_cache_key(cfg, self.dtype), self._draw_weights, self.device)
        self.embed, self.lm_head, self.layers = drawn["embed"], drawn["lm_head"], drawn["layers"]
        if self.fused:
            for p in self.layers:
                self._fuse_weights(p)
        self.scale = 1.0 / math.sqrt(cfg.kv_dim)

    def _draw_weights(self) -> dict:
        """The model's weights from one seeded CPU generator (the same on every device), in
        a fixed order: {"embed", "lm_head", "layers": [per-layer dict]}. Reads only
        ``cfg``, ``specs``, ``device`` and ``dtype`` (``predraw`` calls it without a model)."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape, fan_in=None):
            fan_in = fan_in or shape[0]
            t = torch.randn(*shape, generator=g) / math.sqrt(fan_in)
            return t.to(self.device, self.dtype)

        D, F_, H, d, di, V = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_heads,
            cfg.kv_dim,
            cfg.index_dim,
            cfg.vocab_size,
        )
        embed = torch.randn(V, D, generator=g).to(self.device, self.dtype)
        lm_head = w(D, V)
        layers = []
        for spec in self.specs:
            p = {
                "wq": w(D, H * d),
                "wo": w(H * d, D),
                "w1": w(D, F_),
                "w3": w(D, F_),
                "w2": w(F_, D),
            }
            if spec.writes_source:
                p["wkv"] = w(D, d)
            if spec.role == "full":
                p["wik"] = w(D, di)
            if spec.selects:
                p["wiq"] = w(D, di)
                sal = torch.randn(di, generator=g)
                p["w_sal"] = (sal / sal.norm()).to(self.device, torch.float32)
            layers.append(p)
        return {"embed": embed, "lm_head": lm_head, "layers": layers}

    @staticmethod
    def _fuse_weights(p: dict) -> None:
        """One GEMM for every projection of the layer input (KV row, queries, index key,
        index query) and one for the MLP's gate and up projections: the same weights,
        concatenated by columns, so a layer launches two GEMMs where it launched up to six."""
        names = [n for n in ("wkv", "wq", "wik", "wiq") if n in p]
        cols, c0 = {}, 0
        for n in names:
            cols[n] = (c0, c0 + p[n].shape[1])
            c0 = cols[n][1]
        p["w_in"] = torch.cat([p.pop(n) for n in names], dim=1)
        p["in_cols"] = cols
        p["w13"] = torch.cat([p.pop("w1"), p.pop("w3")], dim=1)

    @staticmethod
    def _weight(p: dict, name: str) -> torch.Tensor:
        """A projection's weight, a column view of the fused ``w_in`` where it was fused."""
        if name in p:
            return p[name]
        c0, c1 = p["in_cols"][name]
        return p["w_in"][:, c0:c1]

    # ------------------------------------------------------------------ building blocks
    def _mm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """A projection ``x @ w``: cuBLAS, or the batch-invariant kernel (``gemm_impl``)."""
        return mm(x, w, self.gemm_impl)

    def _add_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, rms_norm(x + delta)): the residual add and the next norm, one kernel."""
        return add_rms_norm(x, delta, impl=self.norm_impl)

    def _project(self, spec: LayerSpec, p: dict, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer input's projections by weight name (wkv, wq, wik, wiq, as the role has
        them): one GEMM and column views when the weights are fused."""
        if "w_in" not in p:  # the index query is projected per query chunk (forward)
            return {n: self._mm(h, p[n]) for n in ("wkv", "wq", "wik") if n in p}
        y = self._mm(h, p["w_in"])
        return {n: y[..., c0:c1] for n, (c0, c1) in p["in_cols"].items()}

    def _encode(self, kv: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if self.fused and cfg.kv_format == "fp8":
            return encode_fp8_rows(kv, cfg.kv_dim, cfg.kv_rope_dim, cfg.row_bytes)
        return encode_rows(kv, cfg)

    def _write_kv(self, ctx: KVContext, source: int, kv: torch.Tensor) -> None:
        """The step's new rows of ``source``: encoded straight into the context's pool where it
        says where (one launch), else encoded and handed to ``write_kv``."""
        cfg = self.cfg
        target = None
        if self.fused and cfg.kv_format == "fp8":
            target = ctx.kv_write_target(source)
        if target is None:
            ctx.write_kv(source, self._encode(kv))
        else:
            buf, rows = target
            encode_fp8_rows(kv, cfg.kv_dim, cfg.kv_rope_dim, cfg.row_bytes, buf, rows)

    # The MLP's intermediate of a whole prompt at once (125,000 tokens x 2 x 73,728 on
    # dsv41_h200: 37 GB, and half that again after the gate) would set a prefill's peak memory;
    # past this many bytes the tokens go through it in slices. A decode step's few queries, and
    # prompts whose intermediate stays under it (every preset but the DeepSeek-like H200 one),
    # take the whole at once as before.
    MLP_SLICE_BYTES = 4 << 30

    def _mlp_add_norm(
        self, p: dict, x: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + mlp(h), its norm): row by row, so in token slices where the whole would pass
        MLP_SLICE_BYTES."""
        B, Q, _ = h.shape
        per_token = B * 2 * self.cfg.intermediate_size * h.element_size()
        n = max(1, self.MLP_SLICE_BYTES // per_token)
        if Q <= n:
            return self._add_norm(x, self._mlp(p, h))
        parts = [
            self._add_norm(x[:, c0 : c0 + n], self._mlp(p, h[:, c0 : c0 + n]))
            for c0 in range(0, Q, n)
        ]
        return torch.cat([a for a, _ in parts], dim=1), torch.cat([b for _, b in parts], dim=1)

    def _mlp(self, p: dict, h: torch.Tensor) -> torch.Tensor:
        if "w13" in p:
            return self._mm(silu_mul(self._mm(h, p["w13"]), impl=self.norm_impl), p["w2"])
        return self._mm(F.silu(self._mm(h, p["w1"])) * self._mm(h, p["w3"]), p["w2"])

    def index_query(self, p: dict, h: torch.Tensor) -> torch.Tensor:
        """h (B,Qc,D) -> the indexer's float32 queries (B,Qc,di)."""
        return self._blend_index_query(p, self._mm(h, self._weight(p, "wiq")))

    def _blend_index_query(self, p: dict, iq: torch.Tensor) -> torch.Tensor:
        """The index projection, normalized and blended with the layer's fixed direction by
        the selection-locality knob."""
        return blend_index_query(iq, p["w_sal"], self.cfg.selection_locality, impl=self.norm_impl)

    def select(
        self, p: dict, h: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Top-k over visible history. h (B,Qc,D), keys (B,L,di), positions (B,Qc) -> (B,Qc,k)."""
        scores = torch.einsum("bqd,bld->bql", self.index_query(p, h), keys.float())
        return self.select_from_scores(scores, positions)

    def select_from_scores(self, scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """scores (B,Qc,L) float32, positions (B,Qc) -> top-k positions (B,Qc,k).

        Query at position t sees positions 0..t; it always selects itself (the current row,
        like the local branch of DSA). Equal scores (repeated tokens) rank by position, so the
        selection never depends on the batch (systems/kernels/topk.py). Entries beyond the
        visible history are -1.
        """
        return topk_positions(scores, positions, self.cfg.index_topk, impl=self.topk_impl)

    def attend(self, q: torch.Tensor, rows: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
        """q (B,Qc,H,d), rows (B,Qc,k,d), sel (B,Qc,k) -> (B,Qc,H,d)."""
        s = torch.einsum("bqhd,bqkd->bqhk", q.float(), rows.float()) * self.scale
        s = s.masked_fill((sel < 0).unsqueeze(2), float("-inf"))
        pr = torch.softmax(s, dim=-1)
        return torch.einsum("bqhk,bqkd->bqhd", pr, rows.float()).to(q.dtype)

    def _attend_in_place(
        self, q: torch.Tensor, buf: torch.Tensor, sel: torch.Tensor, loc: torch.Tensor
    ) -> torch.Tensor:
        """``attend(q, decode_rows(buf[loc]), sel)`` in one kernel (systems/kernels/
        sparse_attention.py). q (B,Qc,H,d), sel / loc (B,Qc,k) -> (B,Qc,H,d)."""
        cfg = self.cfg
        B, Qc, H, d = q.shape
        out = sparse_attention(
            q.reshape(B * Qc, H, d),
            buf,
            sel.reshape(B * Qc, -1),
            loc.reshape(B * Qc, -1),
            kv_format=cfg.kv_format,
            kv_dim=d,
            rope_dim=cfg.kv_rope_dim,
            row_dtype=self.dtype,
            impl=self.attention_impl,
        )
        return out.view(B, Qc, H, d)

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        ctx: KVContext,
        q_chunk: int | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, positions: (B, Q). Returns logits (B, Q, V) float32 and hidden (B, Q, D);
        with ``last_only`` the logits of the last query only, (B, 1, V) (prefill)."""
        cfg = self.cfg
        B, Q = tokens.shape
        H, d = cfg.num_heads, cfg.kv_dim
        q_chunk = q_chunk or Q
        verified = ctx.verified_queries()
        if verified is not None:  # a query past its request's K_r selects its own row only
            verified = verified.unsqueeze(2)
            own = torch.full((B, Q, cfg.index_topk), -1, dtype=torch.int32, device=tokens.device)
            own[:, :, 0] = positions
        x = self.embed[tokens.long()]  # (B, Q, D)
        x, h = self._add_norm(x, None)
        last_sel: torch.Tensor | None = None
        last_sel_src: dict[int, torch.Tensor] = {}
        for spec, p in zip(self.specs, self.layers):
            with nvtx_range(PROJ):  # ranges name kernel families for the profiler (Fig. 10)
                proj = self._project(spec, p, h)
                if spec.writes_source:
                    self._write_kv(ctx, spec.source, proj["wkv"])
                if spec.role == "full":
                    ctx.write_index(spec.source, proj["wik"])
                q = proj["wq"].reshape(B, Q, H, d)
            sels, outs = [], []
            for c0 in range(0, Q, q_chunk):
                c1 = min(Q, c0 + q_chunk)
                if spec.selects:
                    with nvtx_range(SELECT):
                        if "wiq" in proj:
                            iq = self._blend_index_query(p, proj["wiq"][:, c0:c1])
                        else:
                            iq = self.index_query(p, h[:, c0:c1])
                        scores = ctx.index_scores(spec.source, iq)
                        sel = self.select_from_scores(scores, positions[:, c0:c1])
                        if verified is not None:
                            sel = torch.where(verified[:, c0:c1], sel, own[:, c0:c1])
                elif spec.role == "follower":
                    sel = last_sel[:, c0:c1]
                else:  # reuse: the latest selection made on this source
                    sel = last_sel_src[spec.source][:, c0:c1]
                if self.attention_impl == "reference":
                    raw = ctx.gather(spec, sel, c0, spec.role == "reuse")
                    with nvtx_range(ATTEND):
                        rows = decode_rows(raw, cfg, self.dtype)
                        outs.append(self.attend(q[:, c0:c1], rows, sel))
                else:  # the rows are read in place by location: no gathered copy
                    buf, loc = ctx.locate(spec, sel, c0, spec.role == "reuse")
                    with nvtx_range(ATTEND):
                        outs.append(self._attend_in_place(q[:, c0:c1], buf, sel, loc))
                if spec.selects:
                    sels.append(sel)
            if spec.selects:
                last_sel = torch.cat(sels, dim=1) if len(sels) > 1 else sels[0]
                last_sel_src[spec.source] = last_sel
            attn = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
            with nvtx_range(PROJ):
                x, h2 = self._add_norm(x, self._mm(attn.reshape(B, Q, H * d), p["wo"]))
            with nvtx_range(MLP):
                # the next layer's input norm (the final norm after the last layer) fused in
                x, h = self._mlp_add_norm(p, x, h2)
        hidden = h
        logits = self._mm(hidden[:, -1:] if last_only else hidden, self.lm_head).float()
        return logits, hidden


class PrefillContext:
    """KV context of one prompt processed in a single pass: rows live in local buffers.

    After the forward, ``kv`` (S, T, row_bytes) and ``index`` (one (T, di) per index source) are
    the prompt's history, which admission imports into a KV backend (the handoff).
    """

    def __init__(self, cfg: ModelConfig, T: int, device: torch.device, dtype: torch.dtype):
        self.cfg = cfg
        self.kv = torch.zeros(cfg.num_sources, T, cfg.row_bytes, dtype=torch.uint8, device=device)
        self.index = {
            s: torch.zeros(T, cfg.index_dim, dtype=torch.bfloat16, device=device)
            for s in cfg.index_sources
        }

    def kv_write_target(self, source):
        return None  # the prompt's rows are written whole (write_kv)

    def write_kv(self, source, rows):
        self.kv[source] = rows[0]

    def write_index(self, source, keys):
        self.index[source].copy_(keys[0])

    def index_scores(self, source, iq):
        return torch.einsum("bqd,ld->bql", iq, self.index[source].float())

    def verified_queries(self):
        return None  # every query of a prompt counts

    def locate(self, layer, selections, q0, inherit):
        return self.kv[layer.source], selections  # a prompt's row p is local row p

    def gather(self, layer, selections, q0, inherit):
        idx = selections.clamp_min(0).long()  # (1, Qc, k)
        return self.kv[layer.source][idx[0]].unsqueeze(0)


def prefill_chunk_size(cfg: ModelConfig, T: int, budget_elems: int = 1 << 24) -> int:
    # budget_elems bounds the transient (Qc x T) scores and (Qc x k x row) rows of one chunk
    """Query chunk so that scores (Qc x T) and gathered rows (Qc x k x d) stay bounded."""
    per_q = max(T, cfg.index_topk * max(cfg.kv_dim, cfg.row_bytes))
    return max(1, min(T, budget_elems // per_q))
