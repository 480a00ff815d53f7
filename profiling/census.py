"""Retrieval census (paper sec. 3.2 and Table 3) from backend counters.

The KV backends keep cumulative counters (``backend.metrics()``, also served on /metrics and
sampled once a second by the load generator). Everything here is a difference of two snapshots:

    census(before, after)            -> Census: per token, per request, per step
    retrieval_geometry(model_cfg)    -> what the geometry alone fixes (Table 3's upper rows)
    CensusCollector(source)          -> snapshots of a live engine, one Census per interval

A counter absent from a snapshot counts as 0 (the resident backend resolves nothing).

Counting conventions of the bundled engine (document them beside any number shown):
- ``dhs_selected_rows_*`` count row lookups of every resolver call, follower layers' calls
  included (a GLM-like selection is looked up once per payload layer it feeds). The paper's
  "selections per token" counts producer selections; with a geometry given, ``census`` scales
  the lookups to producer selections (``selections_per_token``), the shares are unchanged.
- ``dhs_resolver_calls_total`` counts every resolve call; follower calls are split off by the
  counter ``dhs_follower_copies_total`` when the backend exports it, else by the geometry's
  ratio (``follower_split='geometry'``). Contract for that counter: it counts the follower-layer
  calls *among* ``dhs_resolver_calls_total``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# counter names (backend.metrics() / engine.metrics())
SELECTED = "dhs_selected_rows_total"
DIRECT = "dhs_selected_rows_direct_total"
HOT = "dhs_selected_rows_hot_total"
FROM_HOST = "dhs_selected_rows_from_host_total"
HOST_ROWS = "dhs_host_rows_copied_total"
HOST_BYTES = "dhs_host_bytes_total"
RESOLVER_CALLS = "dhs_resolver_calls_total"
FOLLOWER_COPIES = "dhs_follower_copies_total"  # optional: follower-layer resolves / copies
BACKUP_ROWS = "dhs_host_backup_rows_total"
COVERAGE = "dhs_ready_optional_coverage"  # a gauge, not a counter
TOKENS = "dhs_generated_tokens_total"
# each admission emits its request's first token from the prefill's logits, which looks nothing
# up: "per token" counts the decoded tokens, the generated ones less those first tokens
FIRST_TOKENS = "dhs_first_tokens_total"
REQUESTS = "dhs_finished_total"
STEPS = "dhs_num_steps"

COUNTERS = (
    SELECTED,
    DIRECT,
    HOT,
    FROM_HOST,
    HOST_ROWS,
    HOST_BYTES,
    RESOLVER_CALLS,
    FOLLOWER_COPIES,
    BACKUP_ROWS,
    TOKENS,
    FIRST_TOKENS,
    REQUESTS,
    STEPS,
)


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


@dataclass
class RetrievalGeometry:
    """Table 3's geometry rows for a model configuration."""

    selecting_layers: int
    k: int
    selections_per_token: int  # selecting layers x k (per generated token, per request)
    kv_sources: int
    payload_layers: int  # layers that read selected rows with their own bytes or a shared source
    follower_layers: int
    sources_per_selection: float  # mean number of distinct source rows one selection reads
    row_bytes: int
    bytes_per_missed_selection: float  # row_bytes x sources_per_selection
    resolver_calls_per_step: int  # producer / reindex calls (reuse layers inherit locations)
    follower_copies_per_step: int
    hot_cache_rows: int
    hot_cache_bytes_per_session: int  # B rows per KV source

    def as_dict(self) -> dict:
        return asdict(self)


def retrieval_geometry(model_cfg: Any, hot_cache_rows: int) -> RetrievalGeometry:
    """From a ``systems.models.config.ModelConfig`` (anything with ``layers`` of LayerSpec,
    ``index_topk``, ``num_sources``, ``row_bytes``) and the resolved B (``system.kv``)."""
    layers = list(model_cfg.layers)
    k = int(model_cfg.index_topk)
    selecting = [l for l in layers if l.selects]
    followers = [l for l in layers if l.role == "follower"]
    # distinct sources read per selection: a producer's own source, plus each follower that
    # reuses its positions (own bytes); reindex/reuse layers read the shared source again
    srcs_per_sel: list[set[int]] = []
    cur: set[int] | None = None
    for l in layers:
        if l.selects:
            cur = {l.source}
            srcs_per_sel.append(cur)
        elif cur is not None:
            cur.add(l.source)
    mean_srcs = sum(len(s) for s in srcs_per_sel) / len(srcs_per_sel) if srcs_per_sel else 0.0
    B = int(hot_cache_rows)
    rb = int(model_cfg.row_bytes)
    S = int(model_cfg.num_sources)
    return RetrievalGeometry(
        selecting_layers=len(selecting),
        k=k,
        selections_per_token=len(selecting) * k,
        kv_sources=S,
        payload_layers=len(layers),
        follower_layers=len(followers),
        sources_per_selection=mean_srcs,
        row_bytes=rb,
        bytes_per_missed_selection=rb * mean_srcs,
        resolver_calls_per_step=len(selecting),
        follower_copies_per_step=len(followers),
        hot_cache_rows=B,
        hot_cache_bytes_per_session=B * rb * S,
    )


@dataclass
class Census:
    """Differences of two counter snapshots, normalized (None where the divisor is 0)."""

    interval_s: float | None
    tokens: float
    requests: float
    steps: float
    row_lookups: float
    direct_rows: float
    hot_rows: float
    host_rows: float  # selections that missed (fetched from host)
    host_rows_copied: float  # distinct rows copied from host
    host_bytes: float
    resolver_calls: float
    follower_copies: float | None
    backup_rows: float
    # normalized
    row_lookups_per_token: float | None
    selections_per_token: float | None
    direct_share: float | None
    hot_share: float | None
    host_share: float | None
    host_rows_copied_per_token: float | None
    host_bytes_per_token: float | None
    host_bytes_per_request: float | None
    bytes_per_copied_row: float | None
    resolver_calls_per_step: float | None
    follower_copies_per_step: float | None
    backup_rows_per_token: float | None
    ready_optional_coverage: float | None
    follower_split: str  # counter | geometry | none

    def as_dict(self) -> dict:
        return asdict(self)


def census(
    before: Mapping[str, float] | None,
    after: Mapping[str, float],
    *,
    tokens: float | None = None,
    requests: float | None = None,
    steps: float | None = None,
    geometry: RetrievalGeometry | None = None,
    interval_s: float | None = None,
) -> Census:
    """Census between two snapshots (``before=None``: since start). ``tokens`` / ``requests`` /
    ``steps`` override the engine's own counters (``dhs_generated_tokens_total``,
    ``dhs_finished_total``, ``dhs_num_steps``) when the caller counted them itself, e.g. from the
    load generator's records."""
    before = before or {}

    def d(key: str) -> float:
        return float(after.get(key, 0) or 0) - float(before.get(key, 0) or 0)

    for key in COUNTERS:
        if key in after and d(key) < 0:
            raise ValueError(
                f"counter {key} went backwards ({before.get(key)} -> {after[key]}): "
                "snapshots out of order or from different servers"
            )
    tok = float(tokens) if tokens is not None else d(TOKENS) - d(FIRST_TOKENS)
    req = float(requests) if requests is not None else d(REQUESTS)
    stp = float(steps) if steps is not None else d(STEPS)
    lookups, direct, hot, host = d(SELECTED), d(DIRECT), d(HOT), d(FROM_HOST)
    if lookups == 0 and (direct or hot or host):
        lookups = direct + hot + host
    calls = d(RESOLVER_CALLS)
    if FOLLOWER_COPIES in after:
        fcopies, split = d(FOLLOWER_COPIES), "counter"
        producer_calls = max(calls - fcopies, 0.0)  # follower calls are among the calls
    elif geometry is not None and (
        geometry.resolver_calls_per_step + geometry.follower_copies_per_step
    ):
        frac = geometry.follower_copies_per_step / (
            geometry.resolver_calls_per_step + geometry.follower_copies_per_step
        )
        fcopies, split = calls * frac, "geometry"
        producer_calls = calls - fcopies
    else:
        fcopies, split, producer_calls = None, "none", calls
    lpt = _div(lookups, tok)
    if geometry is not None and lpt is not None:
        per_sel = geometry.follower_copies_per_step + geometry.resolver_calls_per_step
        spt = lpt * geometry.resolver_calls_per_step / per_sel if per_sel else lpt
    else:
        spt = lpt
    cov = after.get(COVERAGE)
    return Census(
        interval_s=interval_s,
        tokens=tok,
        requests=req,
        steps=stp,
        row_lookups=lookups,
        direct_rows=direct,
        hot_rows=hot,
        host_rows=host,
        host_rows_copied=d(HOST_ROWS),
        host_bytes=d(HOST_BYTES),
        resolver_calls=producer_calls,
        follower_copies=fcopies,
        backup_rows=d(BACKUP_ROWS),
        row_lookups_per_token=lpt,
        selections_per_token=spt,
        direct_share=_div(direct, lookups),
        hot_share=_div(hot, lookups),
        host_share=_div(host, lookups),
        host_rows_copied_per_token=_div(d(HOST_ROWS), tok),
        host_bytes_per_token=_div(d(HOST_BYTES), tok),
        host_bytes_per_request=_div(d(HOST_BYTES), req),
        bytes_per_copied_row=_div(d(HOST_BYTES), d(HOST_ROWS)),
        resolver_calls_per_step=_div(producer_calls, stp),
        follower_copies_per_step=_div(fcopies, stp) if fcopies is not None else None,
        backup_rows_per_token=_div(d(BACKUP_ROWS), tok),
        ready_optional_coverage=float(cov) if cov is not None else None,
        follower_split=split,
    )


def census_series(
    samples: Sequence[Mapping[str, float]],
    *,
    ts_key: str = "ts",
    geometry: RetrievalGeometry | None = None,
) -> list[dict]:
    """One census per consecutive pair of samples (e.g. the one-second /metrics samples of a
    run, ``server_metrics.parquet`` rows): the time series behind Fig. 6's host-fetched share."""
    out = []
    for a, b in zip(samples, samples[1:]):
        dt = None
        if ts_key in a and ts_key in b:
            dt = float(b[ts_key]) - float(a[ts_key])
        row = census(a, b, geometry=geometry, interval_s=dt).as_dict()
        if ts_key in b:
            row[ts_key] = b[ts_key]
        out.append(row)
    return out


def _metrics_of(source: Any) -> Callable[[], Mapping[str, float]]:
    if callable(source) and not hasattr(source, "metrics"):
        return source
    if hasattr(source, "metrics"):
        return source.metrics
    raise TypeError(
        "census source must be an engine / backend (with .metrics()) or a callable "
        "returning a metrics dict"
    )


class CensusCollector:
    """Snapshots of a live engine (or backend, or any ``() -> metrics`` callable).

    ``start()`` takes the first snapshot, ``sample()`` another (call it once a second, not per
    step: reading the device counters syncs), ``result()`` the census from first to last, and
    ``series()`` one census per interval."""

    name = "census"

    def __init__(
        self,
        source: Any = None,
        *,
        geometry: RetrievalGeometry | None = None,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ):
        self._read = _metrics_of(source) if source is not None else None
        self.geometry = geometry
        self.interval_s = float(interval_s)
        self.clock = clock
        self.samples: list[dict] = []

    def record(self, metrics: Mapping[str, float], ts: float | None = None) -> None:
        snap = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        snap["ts"] = self.clock() if ts is None else ts
        self.samples.append(snap)

    def start(self) -> None:
        self.samples.clear()
        self.sample(force=True)

    def sample(self, force: bool = True) -> None:
        if self._read is None:
            return
        now = self.clock()
        if not force and self.samples and now - self.samples[-1]["ts"] < self.interval_s:
            return
        self.record(self._read(), now)

    def step(self, sessions: int | None = None) -> None:
        """Per engine step: samples only when ``interval_s`` has passed since the last one."""
        self.sample(force=False)

    def result(self) -> Census | None:
        if len(self.samples) < 2:
            return None
        a, b = self.samples[0], self.samples[-1]
        return census(a, b, geometry=self.geometry, interval_s=b["ts"] - a["ts"])

    def series(self) -> list[dict]:
        return census_series(self.samples, geometry=self.geometry)
