"""Model geometry: the part of a sparse-attention model that decides what the KV layer stores.

Two reuse structures from the paper (sec. 2.2) are expressed with one vocabulary of layer roles:

- ``full``:     computes a KV row into its own source, owns index keys, selects top-k.
- ``follower``: computes a KV row into its own source, reuses the positions selected by the
                most recent selecting layer (GLM-like: 21 producers announce for 78 payload layers).
- ``reindex``:  reads a source written by an earlier ``full`` layer and selects afresh over that
                source's index keys (DeepSeek-like shared KV).
- ``reuse``:    reads a source written by an earlier ``full`` layer with the latest selection made
                on that source; it inherits the location vector without another resolver call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ROLES = ("full", "follower", "reindex", "reuse")
KV_FORMATS = ("bf16", "fp8")


# auto: the Triton kernels on a GPU that passes their self-check, else reference;
# triton_mma: the all-heads tensor-core attention kernel (the index scan as triton)
ATTENTION_IMPLS = ("auto", "triton", "triton_mma", "reference")
GEMM_IMPLS = ("cublas", "triton")  # systems/kernels/gemm.py


# the fields that set the random weights' shapes (and so what a drawn model selects): a
# calibration measured on one geometry says nothing certain about another
GEOMETRY_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "kv_dim",
    "index_dim",
    "index_topk",
    "layer_roles",
)


@dataclass(frozen=True)
class LayerSpec:
    index: int
    role: str
    source: int

    @property
    def writes_source(self) -> bool:
        return self.role in ("full", "follower")

    @property
    def selects(self) -> bool:
        return self.role in ("full", "reindex")


@dataclass
class ModelConfig:
    name: str = "tiny"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_heads: int = 2
    kv_dim: int = 32  # width of one stored latent row (MLA-like: keys and values share it)
    kv_rope_dim: int = 0  # trailing dims kept in bf16 by the fp8 format (paper: 64 of 576)
    kv_format: str = "bf16"  # bf16 | fp8 (fp8 with 576 dims gives the paper's 656-byte row)
    # sparse attention: auto (Triton kernel on GPU, reference on CPU) | triton | reference
    attention_impl: str = "auto"
    # the projections' GEMMs: cublas (torch.matmul) | triton (batch invariant: a row's bits do
    # not depend on the rows beside it; systems/kernels/gemm.py)
    gemm_impl: str = "cublas"
    index_dim: int = 16
    index_topk: int = 8  # k
    # Selection locality (the one calibrated input, docs/design.md): the indexer query is
    # blended with a fixed per-layer direction, q' = (1 - lam) * q + lam * w. lam = 0 gives the
    # random model's nearly independent selections; lam -> 1 makes consecutive selections overlap.
    selection_locality: float = 0.0
    layer_roles: list[str] = field(default_factory=lambda: ["full", "follower", "full", "follower"])
    layer_sources: list[int] | None = None  # default: one source per writing layer, in order
    max_context_len: int = 4096
    hot_cache_rows: int = 0  # B of the HiSparse family, per request and KV source; 0 = 2k
    page_size: int = 16
    eos_token_id: int = 1
    seed: int = 0
    dtype: str = "float32"  # compute dtype: float32 on CPU, bfloat16 on GPU

    def __post_init__(self) -> None:
        self.layer_roles = list(self.layer_roles)
        if self.layer_sources is not None:
            self.layer_sources = list(self.layer_sources)
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        def bad(fld: str, msg: str) -> ValueError:
            return ValueError(f"model.{fld}: {msg}")

        sizes = [k for k in GEOMETRY_KEYS if k != "layer_roles"]
        for fld in (*sizes, "max_context_len", "page_size"):
            if int(getattr(self, fld)) < 1:
                raise bad(fld, f"must be >= 1, got {getattr(self, fld)}")
        if self.index_topk > self.max_context_len:
            raise bad(
                "index_topk",
                f"k={self.index_topk} is larger than the context "
                f"max_context_len={self.max_context_len}",
            )
        if self.hot_cache_rows < 0:
            raise bad("hot_cache_rows", f"must be >= 0, got {self.hot_cache_rows}")
        if not 0.0 <= self.selection_locality <= 1.0:
            raise bad("selection_locality", f"must be in [0, 1], got {self.selection_locality}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise bad(
                "attention_impl",
                f"must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention_impl!r}",
            )
        if self.gemm_impl not in GEMM_IMPLS:
            raise bad(
                "gemm_impl", f"must be one of {', '.join(GEMM_IMPLS)}, got {self.gemm_impl!r}"
            )
        if self.kv_format not in KV_FORMATS:
            raise bad("kv_format", f"must be one of {KV_FORMATS}, got {self.kv_format!r}")
        if self.kv_format == "fp8":
            nope = self.kv_dim - self.kv_rope_dim
            if nope <= 0 or nope % 128:
                raise bad(
                    "kv_dim",
                    "fp8 rows need kv_dim - kv_rope_dim to be a positive multiple "
                    f"of 128 (got {self.kv_dim} - {self.kv_rope_dim})",
                )
        if not self.layer_roles:
            raise bad("layer_roles", "at least one layer is required")
        for i, r in enumerate(self.layer_roles):
            if r not in ROLES:
                raise bad("layer_roles", f"layer {i} has role {r!r}; allowed: {ROLES}")
        if self.layer_roles[0] != "full":
            raise bad("layer_roles", "layer 0 must be 'full' (no earlier layer to select or write)")
        self.layers  # noqa: B018 (builds and checks sources)

    # ------------------------------------------------------------------ derived geometry
    @property
    def layers(self) -> list[LayerSpec]:
        roles = self.layer_roles
        if self.layer_sources is None:
            srcs, nxt, last_full = [], 0, -1
            for r in roles:
                if r in ("full", "follower"):
                    srcs.append(nxt)
                    last_full = nxt if r == "full" else last_full
                    nxt += 1
                else:
                    srcs.append(last_full)
        else:
            srcs = self.layer_sources
            if len(srcs) != len(roles):
                raise ValueError(
                    f"model.layer_sources: has {len(srcs)} entries for {len(roles)} layer_roles"
                )
        written: dict[int, str] = {}
        out = []
        for i, (r, s) in enumerate(zip(roles, srcs)):
            if r in ("full", "follower"):
                if s in written:
                    raise ValueError(
                        f"model.layer_sources: layer {i} ({r}) writes source {s}, "
                        f"already written by an earlier layer"
                    )
                written[s] = r
            else:
                if written.get(s) != "full":
                    raise ValueError(
                        f"model.layer_sources: layer {i} ({r}) references source {s}, "
                        "which no earlier 'full' layer writes"
                    )
            out.append(LayerSpec(i, r, int(s)))
        if sorted(written) != list(range(len(written))):
            raise ValueError("model.layer_sources: written sources must be numbered 0..S-1")
        return out

    @property
    def num_layers(self) -> int:
        return len(self.layer_roles)

    @property
    def num_sources(self) -> int:
        return sum(1 for r in self.layer_roles if r in ("full", "follower"))

    @property
    def index_sources(self) -> list[int]:
        """Sources that carry index keys (written by a ``full`` layer), in order."""
        return [l.source for l in self.layers if l.role == "full"]

    @property
    def num_selecting_layers(self) -> int:
        return sum(1 for l in self.layers if l.selects)

    @property
    def row_bytes(self) -> int:
        if self.kv_format == "bf16":
            return 2 * self.kv_dim
        nope = self.kv_dim - self.kv_rope_dim
        return nope + 4 * (nope // 128) + 2 * self.kv_rope_dim

    @property
    def index_row_bytes(self) -> int:
        return 2 * self.index_dim  # index keys are kept in 16-bit on the GPU

    def weight_bytes(self, bytes_per_param: int = 2) -> int:
        d, f, h, kv, di, v = (
            self.hidden_size,
            self.intermediate_size,
            self.num_heads,
            self.kv_dim,
            self.index_dim,
            self.vocab_size,
        )
        per_layer = d * h * kv * 2 + 3 * d * f
        per_layer_src = d * kv
        total = 2 * v * d
        for l in self.layers:
            total += per_layer + (per_layer_src if l.writes_source else 0)
            total += d * di if l.selects else 0
            total += d * di if l.role == "full" else 0
        return total * bytes_per_param

    def pages_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.page_size)
