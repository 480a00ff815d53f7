"""Capacity accounting: the per-session memory of each KV policy (Table 1), for any geometry.

What a session needs
--------------------
For a history of ``T`` tokens (page-rounded to ``p`` rows), with ``S`` payload sources of
``d_KV`` bytes per row and ``P`` index producers of ``d_I`` bytes per row:

=====================  ===========================================================  ==========
component              bytes per session                                            lives on
=====================  ===========================================================  ==========
index keys             ``ceil(T/p)*p * P * d_I``                                    GPU (all)
history payload        ``ceil(T/p)*p * S * d_KV``                                   GPU (resident) / host
hot cache              ``sum_s B_s * d_KV``  (B rows per payload source)            GPU (offloaded)
tail                   ``tail_rows * S * d_KV`` (one page per source by default)    GPU (offloaded)
metadata               ``metadata_bytes`` (default 0, see below)                    GPU (offloaded)
draft ring             ``R_d * draft_bytes_per_row``, eq. (9)                       GPU (with drafter)
verification staging   ``M_stage / N = chi * K_max * k * d_KV``, eq. (11)           GPU (ADHS)
=====================  ===========================================================  ==========

Methods: ``resident`` = index keys + history payload; ``hisparse`` = ``adaptive_hisparse`` =
index keys + hot cache + tail + metadata on the GPU (optional residency is excluded: it only uses
HBM that is spare), the history payload on the host; ``resident_drafter`` (Resident + DFlash2 /
DSpark) = resident + draft ring (a resident history needs no staging); ``adaptive_dhisparse`` =
adaptive + draft ring + the session's share of staging.

Derivation of the paper's Table 1 (GLM-5.3)
-------------------------------------------
Published facts: 78 payload layers with their own bytes, 21 index producers, k = 2,048,
B = 4,096, page p = 64; "hot cache per session 184 MB" (Table 3); eq. (11) gives 1.23 GiB for
chi = 4, N = 35, K_max = 8, k = 2,048 and 24.0 GiB for 78 dedicated arenas; Fig. 8a says one
query's top-k over 32 requests is 37.75 MB; the index pool holds 5.37 M rows = 52 histories of
"100K input and 2,048 output" (3.72 M = 36).

1. *Row bytes.* 184 MB = 4,096 x 78 x 576 B (184,025,088 B); 1.23 GiB = 4 x 35 x 8 x 2,048 x 576 B
   (1.2305 GiB); 24.0 GiB = the same with 78 arenas (23.99 GiB); 37.75 MB = 2,048 x 32 x 576 B.
   The paper's accounting therefore uses ``d_KV = 576`` bytes per row: the 576 latent dims at one
   byte each. The FP8 row as stored by SGLang (and by our engine) is 656 B (512 FP8 values, four
   FP32 scales, 64 bf16 rope dims); only Table 3's "2.4 to 2.5 KB per missed selection"
   (= 3.71 payload layers x 656 B = 2.44 KB) reflects it. ``paper_glm53_geometry()`` keeps 576 for
   accounting and 656 as ``transfer_row_bytes``.
2. *Index row bytes.* Resident minus host backup at 100K is 4.444 - 4.186 = 0.258 GiB, which must
   be the index keys of 21 producers over the history: 21 x 132 B (128 FP8 dims + an FP32 scale,
   the DSA indexer format) x 100,032 tokens = 0.2582 GiB.
3. *Context lengths.* "100K" is 100,000 tokens (the index pool: 5.37 M / 52 and 3.72 M / 36 only
   work for 100,000 + 2,048 = 102,048, page-rounded 102,080; with 102,400 + 2,048 the pool would
   hold 51). "32K" is 32,768 (HiSparse's input length). Table 1 counts the context only, not the
   2,048 output tokens; histories are page-rounded (100,000 -> 100,032 rows).
   Resident: 100,032 x (78 x 576 + 21 x 132) = 4.4438 GiB -> 4.444; 32,768 x 47,700 = 1.4557 -> 1.456.
   Host: 100,032 x 78 x 576 = 4.1856 GiB -> 4.186 (without page rounding 4.184).
4. *HiSparse.* index keys + hot cache 0.17139 GiB + tail 64 x 78 x 576 B = 0.00268 GiB:
   0.2582 + 0.1714 + 0.0027 = 0.4323 -> 0.432; 0.0846 + 0.1714 + 0.0027 = 0.2587 -> 0.259.
   The two cells bound the remaining per-session metadata to at most ~0.2 MB (the residuals of
   0.432 and 0.259 allow a constant of 2.70 to 3.08 MB, the tail page is 2.88 MB), so
   ``metadata_bytes = 0``.
5. *Speculative state.* eq. (9): R_d = ceil((2,048 + 63 + 8) / 64) x 64 = 2,176 rows; twelve K/V
   allocations totalling 12,288 B per row (1,024 B each) give 2,176 x 12,288 B = 0.0249 GiB per
   session (0.87 GiB for 35 slots). Staging share: 4 x 8 x 2,048 x 576 B = 0.0352 GiB (N cancels).
   Sum 0.0601 GiB = the "0.060 GiB per session". Resident + DFlash2 = resident + ring:
   4.469 / 1.481; Adaptive DHiSparse = adaptive + 0.0601: 0.492 / 0.319.

With these facts every cell of Table 1 is reproduced to the printed three decimals
(``tests/figures/test_capacity.py``). What is *not* derivable: the split of the 6.6 GiB of fixed
drafter allocations between the KV and index pools, so the 5.37 M -> 3.72 M index-pool rows are
taken as given; :func:`index_pool_histories` reproduces the 52 / 36 histories from them.

Equations implemented here: draft ring size (9) :func:`ring_rows`, ring address (10)
:func:`ring_address`, staging (11) :func:`staging_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

GIB = float(1 << 30)

METHODS = ("resident", "hisparse", "adaptive_hisparse", "resident_drafter", "adaptive_dhisparse")
# system names of the harness that map onto a capacity method
METHOD_ALIASES = {
    "resident": "resident",
    "hisparse": "hisparse",
    "adaptive_hisparse": "adaptive_hisparse",
    "resident_drafter": "resident_drafter",
    "resident_dflash2": "resident_drafter",
    "resident_dspark": "resident_drafter",
    "adaptive_dhisparse": "adaptive_dhisparse",
    "adaptive_dhisparse_dflash2": "adaptive_dhisparse",
    "adaptive_dhisparse_dspark": "adaptive_dhisparse",
}


def canonical_method(name: str) -> str:
    try:
        return METHOD_ALIASES[name]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; expected one of {sorted(METHOD_ALIASES)}"
        ) from None


# ------------------------------------------------------------------------------- equations
def page_round(tokens: int, page_size: int) -> int:
    """Rows a history of ``tokens`` occupies in pages of ``page_size`` rows."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return -(-int(tokens) // page_size) * page_size


def ring_rows(window: int, page_size: int, k_max: int) -> int:
    """Eq. (9): R_d = ceil((W + p - 1 + K_max) / p) * p."""
    if window < 0 or page_size < 1 or k_max < 1:
        raise ValueError("ring_rows needs window >= 0, page_size >= 1, k_max >= 1")
    return -(-(window + page_size - 1 + k_max) // page_size) * page_size


def ring_address(slot: int, position: int, r_d: int) -> int:
    """Eq. (10): phi(i, t) = i * R_d + (t mod R_d)."""
    return slot * r_d + position % r_d


def staging_bytes(chi: int, slots: int, k_max: int, topk: int, row_bytes: int) -> int:
    """Eq. (11): M_stage = chi * N * K_max * k * d_KV (bytes per GPU)."""
    return int(chi) * int(slots) * int(k_max) * int(topk) * int(row_bytes)


# ------------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class DraftSpec:
    """Drafter KV held in a window-bounded ring (sec. 3.4)."""

    window: int = 2048  # W: prior positions the drafter reads
    k_max: int = 8  # K_max: widest verification block
    bytes_per_row: int = 12_288  # summed over the drafter's K/V allocations
    num_allocations: int = 12  # informational (6 layers x K and V in the paper)

    def ring_rows(self, page_size: int) -> int:
        return ring_rows(self.window, page_size, self.k_max)


@dataclass(frozen=True)
class KVGeometry:
    name: str
    payload_sources: int  # KV sources that keep their own bytes
    index_producers: int  # layers that own index keys
    row_bytes: int  # d_KV used for capacity accounting
    index_row_bytes: int  # per producer and token
    index_topk: int  # k
    hot_cache_rows: tuple[int, ...]  # B per payload source
    page_size: int  # p
    chi: int  # payload sources live at once during verification
    draft: DraftSpec = field(default_factory=DraftSpec)
    tail_rows: int | None = None  # per source; default one page
    metadata_bytes: int = 0  # per session, offloaded methods
    slots_per_gpu: int | None = None  # N, only for per-GPU staging / ring figures
    transfer_row_bytes: int | None = None  # bytes moved per missed row (default row_bytes)
    selecting_layers: int | None = None  # resolver calls per step (default index_producers)
    follower_layers: int = 0  # follower-layer copies per step (GLM-like)

    def __post_init__(self) -> None:
        if len(self.hot_cache_rows) != self.payload_sources:
            raise ValueError(
                f"{self.name}: hot_cache_rows has {len(self.hot_cache_rows)} entries "
                f"for {self.payload_sources} payload sources"
            )
        for f in ("payload_sources", "row_bytes", "index_topk", "page_size", "chi"):
            if getattr(self, f) < 1:
                raise ValueError(f"{self.name}: {f} must be >= 1")

    @property
    def tail(self) -> int:
        return self.page_size if self.tail_rows is None else self.tail_rows

    @property
    def ring_rows(self) -> int:
        return self.draft.ring_rows(self.page_size)

    @property
    def bytes_per_token_resident(self) -> int:
        return self.payload_sources * self.row_bytes + self.index_producers * self.index_row_bytes

    def with_(self, **kw) -> KVGeometry:
        return replace(self, **kw)


@dataclass
class SessionMemory:
    """Per-session memory of one method at one context length, by component (bytes)."""

    method: str
    context_tokens: int
    components: dict[str, int]  # GPU-required components
    host_backup: int

    @property
    def gpu_required(self) -> int:
        return int(sum(self.components.values()))

    @property
    def gpu_gib(self) -> float:
        return self.gpu_required / GIB

    @property
    def host_gib(self) -> float:
        return self.host_backup / GIB

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "context_tokens": self.context_tokens,
            "gpu_required_bytes": self.gpu_required,
            "gpu_required_gib": self.gpu_gib,
            "host_backup_bytes": self.host_backup,
            "host_backup_gib": self.host_gib,
            "components_bytes": dict(self.components),
        }


def session_memory(geom: KVGeometry, method: str, context_tokens: int) -> SessionMemory:
    """Required GPU memory and host backup of one session (Table 1 semantics)."""
    m = canonical_method(method)
    rows = page_round(context_tokens, geom.page_size)
    index_keys = rows * geom.index_producers * geom.index_row_bytes
    payload = rows * geom.payload_sources * geom.row_bytes
    ring = geom.ring_rows * geom.draft.bytes_per_row
    comps: dict[str, int] = {"index_keys": index_keys}
    host = 0
    if m in ("resident", "resident_drafter"):
        comps["history_payload"] = payload
        if m == "resident_drafter":
            comps["draft_ring"] = ring
    else:
        comps["hot_cache"] = sum(geom.hot_cache_rows) * geom.row_bytes
        comps["tail"] = geom.tail * geom.payload_sources * geom.row_bytes
        comps["metadata"] = geom.metadata_bytes
        host = payload
        if m == "adaptive_dhisparse":
            comps["draft_ring"] = ring
            comps["staging_share"] = geom.chi * geom.draft.k_max * geom.index_topk * geom.row_bytes
    return SessionMemory(m, int(context_tokens), comps, host)


def table1(
    geom: KVGeometry,
    contexts: Mapping[str, int] | None = None,
    host_context: str | None = None,
    methods: Sequence[str] = METHODS,
) -> dict[str, dict[str, float | None]]:
    """Table 1 for ``geom``: ``{method: {"gpu_<label>": GiB, ..., "host_<label>": GiB | None}}``.

    ``contexts`` maps a column label to a token count (default the paper's ``32k`` = 32,768 and
    ``100k`` = 100,000); the host backup is reported at ``host_context`` (default: the longest).
    """
    contexts = dict(contexts or {"32k": 32_768, "100k": 100_000})
    host_context = host_context or max(contexts, key=contexts.get)
    out: dict[str, dict[str, float | None]] = {}
    for meth in methods:
        row: dict[str, float | None] = {}
        for lab, t in contexts.items():
            row[f"gpu_{lab}"] = session_memory(geom, meth, t).gpu_gib
        hb = session_memory(geom, meth, contexts[host_context]).host_backup
        row[f"host_{host_context}"] = hb / GIB if hb else None
        out[meth] = row
    return out


# ------------------------------------------------------------------------------- pools
def sessions_per_gpu(pool_bytes: float, per_session_bytes: float, fixed_bytes: float = 0.0) -> int:
    """Whole sessions that fit in ``pool_bytes`` after ``fixed_bytes`` of fixed allocations."""
    if per_session_bytes <= 0:
        raise ValueError("per_session_bytes must be > 0")
    return max(0, int((pool_bytes - fixed_bytes) // per_session_bytes))


def sessions_for(
    geom: KVGeometry, method: str, context_tokens: int, pool_bytes: float, fixed_bytes: float = 0.0
) -> int:
    return sessions_per_gpu(
        pool_bytes, session_memory(geom, method, context_tokens).gpu_required, fixed_bytes
    )


def index_pool_histories(
    index_pool_rows: float, input_tokens: int, output_tokens: int, page_size: int
) -> int:
    """Complete histories (input + output, page-rounded) an index pool of that many rows holds."""
    return int(index_pool_rows // page_round(input_tokens + output_tokens, page_size))


def ring_gib_per_gpu(geom: KVGeometry, slots: int) -> float:
    return slots * geom.ring_rows * geom.draft.bytes_per_row / GIB


def staging_gib_per_gpu(geom: KVGeometry, slots: int, chi: int | None = None) -> float:
    return (
        staging_bytes(
            geom.chi if chi is None else chi,
            slots,
            geom.draft.k_max,
            geom.index_topk,
            geom.row_bytes,
        )
        / GIB
    )


def spec_state_gib_per_session(geom: KVGeometry) -> float:
    """Draft ring + staging share added per session by Adaptive DHiSparse."""
    c = session_memory(geom, "adaptive_dhisparse", geom.page_size).components
    return (c["draft_ring"] + c["staging_share"]) / GIB


# ------------------------------------------------------------------------------- retrieval
def retrieval_volume(geom: KVGeometry) -> dict[str, float]:
    """Table 3 quantities that follow from geometry alone."""
    sel_layers = geom.selecting_layers or geom.index_producers
    per_sel = geom.payload_sources / max(1, geom.index_producers) if geom.follower_layers else 1.0
    tb = geom.transfer_row_bytes or geom.row_bytes
    return {
        "selecting_layers": sel_layers,
        "k": geom.index_topk,
        "selections_per_token": sel_layers * geom.index_topk,
        "kv_sources": geom.payload_sources,
        "payload_layers_per_selection": per_sel,
        "bytes_per_missed_selection": per_sel * tb if geom.follower_layers else tb,
        "hot_cache_bytes_per_session": sum(geom.hot_cache_rows) * geom.row_bytes,
        "resolver_calls_per_step": sel_layers,
        "follower_copies_per_step": geom.follower_layers,
    }


def host_bytes_per_token(geom: KVGeometry, miss_share: float) -> float:
    """Bytes fetched from host per generated token at a given share of selections missed."""
    rv = retrieval_volume(geom)
    return miss_share * rv["selections_per_token"] * rv["bytes_per_missed_selection"]


# ------------------------------------------------------------------------------- presets
PAPER_DRAFT = DraftSpec(window=2048, k_max=8, bytes_per_row=12_288, num_allocations=12)


def paper_glm53_geometry() -> KVGeometry:
    """GLM-5.3 as the paper accounts for it (see the module docstring for the derivation)."""
    return KVGeometry(
        name="GLM-5.3 (paper)",
        payload_sources=78,
        index_producers=21,
        row_bytes=576,
        index_row_bytes=132,
        index_topk=2048,
        hot_cache_rows=(4096,) * 78,
        page_size=64,
        chi=4,
        draft=PAPER_DRAFT,
        tail_rows=64,
        metadata_bytes=0,
        slots_per_gpu=35,
        transfer_row_bytes=656,
        selecting_layers=21,
        follower_layers=57,
    )


def paper_dsv41_geometry() -> KVGeometry:
    """DeepSeek-V4.1-Flash as far as the paper describes it (Table 3, sec. 4.1).

    Four shared KV sources of 288-byte rows; 8 selecting layers with k = 512; hot caches of 8,192
    rows for the source five layers select from and 4,096 for each of the other three
    ((8,192 + 3 x 4,096) x 288 B = 5.9 MB, "about 6 MB"). The index-key width is not published:
    132 B (the GLM indexer format) over the four index-owning sources is an assumption.
    """
    return KVGeometry(
        name="DeepSeek-V4.1-Flash (paper)",
        payload_sources=4,
        index_producers=4,
        row_bytes=288,
        index_row_bytes=132,
        index_topk=512,
        hot_cache_rows=(8192, 4096, 4096, 4096),
        page_size=64,
        chi=1,
        draft=PAPER_DRAFT,
        tail_rows=64,
        metadata_bytes=0,
        transfer_row_bytes=288,
        selecting_layers=8,
        follower_layers=0,
    )


def _live_sources(layers) -> int:
    """Largest number of distinct payload sources that consume one selection (chi)."""
    best, cur = 1, set()
    for l in layers:
        if l.role in ("full", "reindex"):
            cur = {l.source}
        else:  # follower / reuse consume the latest selection
            cur.add(l.source)
        best = max(best, len(cur))
    return best


def geometry_from_model(
    cfg,
    draft: DraftSpec | None = None,
    *,
    hot_cache_rows: int,
    tail_rows: int | None = None,
    metadata_bytes: int = 0,
    slots_per_gpu: int | None = None,
    name: str | None = None,
) -> KVGeometry:
    """Geometry of a :class:`systems.models.config.ModelConfig` (our presets).

    Uses the engine's real row format (``cfg.row_bytes``: 656 B for the FP8 576-dim row) for both
    accounting and transfers, ``hot_cache_rows`` (the resolved B) for every payload source, and
    ``chi`` = the most payload sources that consume one selection. ``draft`` defaults to
    :func:`default_draft_for`.
    """
    b = int(hot_cache_rows)
    layers = cfg.layers
    followers = sum(1 for l in layers if l.role == "follower")
    return KVGeometry(
        name=name or cfg.name,
        payload_sources=int(cfg.num_sources),
        index_producers=len(cfg.index_sources),
        row_bytes=int(cfg.row_bytes),
        index_row_bytes=int(cfg.index_row_bytes),
        index_topk=int(cfg.index_topk),
        hot_cache_rows=(b,) * int(cfg.num_sources),
        page_size=int(cfg.page_size),
        chi=_live_sources(layers),
        draft=draft or default_draft_for(cfg),
        tail_rows=tail_rows,
        metadata_bytes=metadata_bytes,
        slots_per_gpu=slots_per_gpu,
        transfer_row_bytes=int(cfg.row_bytes),
        selecting_layers=int(cfg.num_selecting_layers),
        follower_layers=followers,
    )


def default_draft_for(cfg) -> DraftSpec:
    """Assumed drafter for a preset until systems/spec fixes one.

    The paper's W = 2,048 and K_max = 8; ring bytes per row scaled like the paper's (12,288 B
    against 78 x 576 B of target payload per token, 27.35 %) and rounded to whole draft layers,
    each holding a bf16 K and V row of ``kv_dim`` width. Pass an explicit :class:`DraftSpec` when
    the drafter exists.
    """
    target = int(cfg.num_sources) * int(cfg.row_bytes)
    pair = 2 * 2 * int(cfg.kv_dim)  # one layer's K and V rows in bf16
    n_layers = max(1, round(0.2735 * target / pair))
    return DraftSpec(
        window=2048, k_max=8, bytes_per_row=n_layers * pair, num_allocations=2 * n_layers
    )


def load_model_config(name_or_path: str):
    """ModelConfig of a preset in conf/model/ (by name) or a YAML file."""
    from pathlib import Path

    import yaml

    from systems.models.config import ModelConfig

    p = Path(name_or_path)
    if not p.suffix:
        p = Path(__file__).resolve().parents[1] / "conf" / "model" / f"{name_or_path}.yaml"
    data = yaml.safe_load(p.read_text()) or {}
    known = set(ModelConfig.__dataclass_fields__)  # type: ignore[attr-defined]
    return ModelConfig(**{k: v for k, v in data.items() if k in known})


# the experiment whose hierarchy runs use a preset: it sets the preset's B (system.kv)
PRESET_EXPERIMENT = {"glm53_mini": "fig4", "dsv41_mini": "fig5"}


def preset_hot_cache_rows(name: str) -> int:
    """The resolved B that the preset's experiment gives the HiSparse family."""
    from systems.engine.config import compose, kv_options_from

    cfg = compose([f"experiment={PRESET_EXPERIMENT[name]}", "system=hisparse"])
    return kv_options_from(cfg.system, load_model_config(name), "cpu").hot_cache_rows


def preset_geometry(name: str, **kw) -> KVGeometry:
    kw.setdefault("hot_cache_rows", preset_hot_cache_rows(name))
    return geometry_from_model(load_model_config(name), **kw)


def iter_components(sm: SessionMemory) -> Iterable[tuple[str, float]]:
    for k, v in sm.components.items():
        yield k, v / GIB
