"""Pure metric functions over request records (SGLang ``bench_serving`` parity).

All functions are side-effect free and take :class:`harness.records.RequestRecord`
objects (or plain dicts with the same keys, as read back from a records JSONL
file).  Times inside records are seconds; the summary reports latencies in
milliseconds where the key ends in ``_ms`` and seconds where it ends in ``_s``.
See ``docs/metrics.md`` for the definitions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from harness.records import RequestRecord

__all__ = [
    "as_record",
    "token_chunks",
    "ttft_s",
    "e2e_s",
    "end_mono",
    "output_tokens",
    "tpot_s",
    "itl_s",
    "itl_per_token_s",
    "stats",
    "parse_prometheus",
    "metric_total",
    "value_at",
    "active_mean",
    "phase_stats",
    "summarize",
]

PERCENTILES = (("median", 50.0), ("p90", 90.0), ("p99", 99.0))


# --------------------------------------------------------------------------
# per-request quantities
# --------------------------------------------------------------------------


def as_record(r: RequestRecord | Mapping[str, Any]) -> RequestRecord:
    return r if isinstance(r, RequestRecord) else RequestRecord.from_dict(dict(r))


def token_chunks(rec: RequestRecord) -> list:
    """The ``[arrival_mono, n]`` chunks that carry at least one token."""
    return [c for c in rec.chunks if c[1] > 0]


def ttft_s(rec: RequestRecord) -> float | None:
    """Arrival of the first chunk with >= 1 token minus send time."""
    for t, n in rec.chunks:
        if n > 0:
            return t - rec.send_mono
    return None


def end_mono(rec: RequestRecord) -> float | None:
    """Arrival time of the last streamed chunk (any chunk, token-carrying or not)."""
    if rec.chunks:
        return rec.chunks[-1][0]
    return None


def e2e_s(rec: RequestRecord) -> float | None:
    """Last chunk arrival minus send time."""
    t = end_mono(rec)
    return None if t is None else t - rec.send_mono


def output_tokens(rec: RequestRecord) -> int:
    """Output length: the server's ``completion_tokens`` when reported, else the
    sum of streamed chunk token counts."""
    if rec.completion_tokens is not None:
        return int(rec.completion_tokens)
    return int(sum(n for _, n in rec.chunks))


def tpot_s(rec: RequestRecord) -> float | None:
    """(E2E - TTFT) / (output_tokens - 1); None when output_tokens <= 1."""
    n = output_tokens(rec)
    if n <= 1:
        return None
    t, e = ttft_s(rec), e2e_s(rec)
    if t is None or e is None:
        return None
    return (e - t) / (n - 1)


def itl_s(rec: RequestRecord) -> list[float]:
    """Gaps between consecutive token-carrying chunks (one value per gap): SGLang bench_serving's
    ITL for its OpenAI-completions client."""
    out: list[float] = []
    prev = None
    for t, n in rec.chunks:
        if n <= 0:
            continue
        if prev is not None:
            out.append(t - prev)
        prev = t
    return out


def itl_per_token_s(rec: RequestRecord) -> list[float]:
    """Each chunk gap divided by the token count n of the chunk that ends it, once per token
    (n values): SGLang bench_serving's ITL for its native /generate client, weighted by tokens."""
    out: list[float] = []
    prev = None
    for t, n in rec.chunks:
        if n <= 0:
            continue
        if prev is not None:
            out.extend([(t - prev) / n] * n)
        prev = t
    return out


# --------------------------------------------------------------------------
# aggregation helpers
# --------------------------------------------------------------------------


def stats(values: Sequence[float] | np.ndarray, prefix: str, scale: float = 1.0) -> dict:
    """``{prefix_mean, prefix_median, prefix_p90, prefix_p99}`` of ``values * scale``.

    Percentiles use ``numpy.percentile`` (linear interpolation).  Empty input
    gives ``None`` for every key.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        out = {f"{prefix}_mean": None}
        for name, _ in PERCENTILES:
            out[f"{prefix}_{name}"] = None
        return out
    arr = arr * scale
    out = {f"{prefix}_mean": float(arr.mean())}
    qs = np.percentile(arr, [q for _, q in PERCENTILES])
    for (name, _), v in zip(PERCENTILES, qs):
        out[f"{prefix}_{name}"] = float(v)
    return out


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


# --------------------------------------------------------------------------
# Prometheus scrape helpers
# --------------------------------------------------------------------------


def parse_prometheus(text: str) -> dict[str, float]:
    """Parse Prometheus text exposition into ``{name{labels}: value}``.

    Comment (``#``) and blank lines are skipped; an optional trailing sample
    timestamp is ignored; unparsable lines are skipped.  The key is the metric
    name followed by its label block exactly as written (no label block when
    the sample has no labels).
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            close = _find_label_end(line, brace)
            if close < 0:
                continue
            key = line[: close + 1]
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            if len(parts) < 2:
                continue
            key, rest = parts[0], parts[1:]
        if not rest:
            continue
        try:
            out[key] = float(rest[0])
        except ValueError:
            continue
    return out


def _find_label_end(line: str, start: int) -> int:
    """Index of the ``}`` closing the label block, honouring quoted values."""
    in_q = False
    esc = False
    for i in range(start + 1, len(line)):
        ch = line[i]
        if in_q:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_q = False
        elif ch == '"':
            in_q = True
        elif ch == "}":
            return i
    return -1


def metric_total(values: Mapping[str, float], name: str) -> float | None:
    """Sum of all series of metric ``name`` (any labels); None if absent."""
    total = 0.0
    found = False
    for key, v in values.items():
        base = key.split("{", 1)[0]
        if base == name:
            total += v
            found = True
    return total if found else None


def value_at(
    samples: Sequence[Mapping[str, Any]], name: str, ts: float, max_gap: float = math.inf
) -> float | None:
    """Value of metric ``name`` in the scrape sample closest in time to ``ts``; None where
    that sample is more than ``max_gap`` seconds away (scrapes that failed for a while)."""
    best = None
    best_d = math.inf
    for s in samples:
        v = metric_total(s["values"], name)
        if v is None:
            continue
        d = abs(s["ts"] - ts)
        if d < best_d:
            best, best_d = v, d
    return best if best_d <= max_gap else None


def scrape_gap(samples: Sequence[Mapping[str, Any]]) -> float:
    """The median spacing of the scrapes (inf with fewer than two)."""
    ts = sorted(s["ts"] for s in samples)
    return float(np.median(np.diff(ts))) if len(ts) >= 2 else math.inf


def active_mean(
    samples: Sequence[Mapping[str, Any]],
    t0_epoch: float,
    duration_s: float,
    name: str | Sequence[str] = "dhs_num_running_reqs",
) -> float | None:
    """Mean of metric ``name`` over scrape samples with
    ``t0 + D/4 <= ts <= t0 + 3D/4``.  ``name`` may be a list of candidate
    names; the first one present in any sample is used.  None if no sample in
    the window has the metric."""
    names = [name] if isinstance(name, str) else list(name)
    lo, hi = t0_epoch + duration_s / 4.0, t0_epoch + 3.0 * duration_s / 4.0
    for nm in names:
        vals = []
        for s in samples:
            if lo <= s["ts"] <= hi:
                v = metric_total(s["values"], nm)
                if v is not None:
                    vals.append(v)
        if vals:
            return float(np.mean(vals))
    return None


# --------------------------------------------------------------------------
# per-phase statistics (schedules)
# --------------------------------------------------------------------------


def _window_stats(
    recs: Sequence[RequestRecord],
    i: int,
    start: float,
    end: float,
    samples: Sequence[Mapping[str, Any]],
    epoch_offset: float,
    host_metric: str,
    total_metric: str,
    active_metric: str | Sequence[str],
) -> dict:
    """Statistics of the requests of phase ``i`` sent in [start, end) that finished by ``end``,
    the tokens that arrived in the window and the host share of its selections."""
    dur = max(end - start, 0.0)
    sel = [
        r
        for r in recs
        if r.success and r.phase == i and r.send_mono >= start and (end_mono(r) or math.inf) <= end
    ]
    tp = _mean(tpot_s(r) for r in sel)
    tt = _mean(ttft_s(r) for r in sel)
    aw = _mean((r.timing or {}).get("alloc_wait_s") for r in sel)
    # throughput of the window from chunk arrivals of all requests
    toks = 0
    for r in recs:
        if not r.success:
            continue
        for t, n in r.chunks:
            if start <= t < end:
                toks += n
    host_share = None
    if samples:
        s0, s1 = start + epoch_offset, end + epoch_offset
        # a window edge read off a scrape further away than two scrape intervals or a tenth of
        # the window would count another window's selections
        gap = max(2 * scrape_gap(samples), 0.1 * dur)
        h0, h1 = (value_at(samples, host_metric, t, gap) for t in (s0, s1))
        a0, a1 = (value_at(samples, total_metric, t, gap) for t in (s0, s1))
        if None not in (h0, h1, a0, a1) and (a1 - a0) > 0:
            host_share = (h1 - h0) / (a1 - a0)
    act = active_mean(samples, start + epoch_offset, dur, active_metric) if samples else None
    return {
        "phase": i,
        "duration_s": dur,
        "requests": len(sel),
        "tpot_ms_mean": None if tp is None else tp * 1e3,
        "tok_s_per_session": None if not tp else 1.0 / tp,
        "ttft_ms_mean": None if tt is None else tt * 1e3,
        "alloc_wait_s_mean": aw,
        "output_tok_s": toks / dur if dur > 0 else None,
        "host_fetched_share": host_share,
        "active_mean": act,
    }


def phase_stats(
    records: Sequence[RequestRecord | Mapping[str, Any]],
    phases: Sequence[Mapping[str, Any]],
    samples: Sequence[Mapping[str, Any]] = (),
    *,
    epoch_offset: float = 0.0,
    host_metric: str = "dhs_selected_rows_from_host_total",
    total_metric: str = "dhs_selected_rows_total",
    active_metric: str | Sequence[str] = "dhs_num_running_reqs",
) -> list[dict]:
    """Statistics per schedule phase.

    ``phases``: dicts with ``phase``, ``concurrency``, ``start_mono``,
    ``end_mono``.  A request belongs to a phase when it was sent during the
    phase (its recorded ``phase``) and its last chunk arrived before the phase
    ended.  ``epoch_offset`` converts monotonic to epoch time
    (``epoch = mono + epoch_offset``) for matching scrape samples.
    """
    recs = [as_record(r) for r in records]
    kw = dict(
        epoch_offset=epoch_offset,
        host_metric=host_metric,
        total_metric=total_metric,
        active_metric=active_metric,
    )
    out = []
    t_first = float(phases[0]["start_mono"]) if phases else 0.0
    for ph in phases:
        start, end = float(ph["start_mono"]), float(ph["end_mono"])
        st = _window_stats(recs, int(ph["phase"]), start, end, samples, **kw)
        # relative to the first phase's start
        out.append({"concurrency": ph.get("concurrency"), "start_s": start - t_first, **st})
    return out


def recovery_time(
    records: Sequence[RequestRecord | Mapping[str, Any]], phase: Mapping[str, Any]
) -> float | None:
    """When the client's in-flight count first fell to ``phase``'s concurrency inside it (its
    start if it was there already): after a step down, the requests of the higher load drain
    first. None when it never did."""
    recs = [as_record(r) for r in records]
    start, end = float(phase["start_mono"]), float(phase["end_mono"])
    conc = int(phase["concurrency"])
    # a request is in flight from its send until the client is done with it (done_mono: its
    # last chunk, or the failure), as the load generator counts it; zero-length spans never are
    spans = [(r.send_mono, r.done_mono or end_mono(r) or r.send_mono) for r in recs]
    spans = [(a, b) for a, b in spans if b > a]
    n = sum(1 for a, b in spans if a <= start < b)
    if n <= conc:
        return start
    events = sorted(
        [(a, 1) for a, _ in spans if start < a < end]
        + [(b, -1) for _, b in spans if start < b < end]
    )
    for t, d in events:  # ends before sends at one instant: sort puts -1 first
        n += d
        if n <= conc:
            return t
    return None


# --------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------


def summarize(
    records: Sequence[RequestRecord | Mapping[str, Any]],
    *,
    num_gpus: int = 1,
    post_wave_exclude: int | None = None,
    samples: Sequence[Mapping[str, Any]] = (),
    epoch_offset: float | None = None,
    phases: Sequence[Mapping[str, Any]] | None = None,
    duration_s: float | None = None,
    active_metric: str | Sequence[str] = ("dhs_num_running_reqs",),
    host_metric: str = "dhs_selected_rows_from_host_total",
    total_metric: str = "dhs_selected_rows_total",
) -> dict:
    """Aggregate a run into the summary dict (see docs/metrics.md).

    * Failed requests (``success`` false) are excluded from every latency and
      throughput statistic and counted in ``errors``.
    * ``duration_s`` defaults to first send -> last completion over all
      measured requests.
    * ``post_wave_exclude``: exclude the first that many requests by submission
      order (``index``) for the ``post_wave_*`` keys; None -> keys are None.
    * ``epoch_offset``: ``epoch = mono + epoch_offset``; defaults to the
      offset implied by the records' ``send_epoch - send_mono``.
    """
    recs = [as_record(r) for r in records]
    ok = [r for r in recs if r.success]
    bad = [r for r in recs if not r.success]

    if epoch_offset is None:
        epoch_offset = float(np.median([r.send_epoch - r.send_mono for r in recs])) if recs else 0.0

    if duration_s is None:
        if recs:
            t0 = min(r.send_mono for r in recs)
            # a request ends at its last chunk (as E2E does), a failed one when its response
            # ended: one that streamed and then timed out or was aborted ends after its last chunk
            ends = [
                r.done_mono
                if (not r.success and r.done_mono is not None) or end_mono(r) is None
                else end_mono(r)
                for r in recs
            ]
            ends = [e for e in ends if e is not None]
            t1 = max(ends) if ends else t0
            duration_s = max(t1 - t0, 0.0)
        else:
            t0 = 0.0
            duration_s = 0.0
    else:
        t0 = min(r.send_mono for r in recs) if recs else 0.0

    out_toks = [output_tokens(r) for r in ok]
    total_out = int(sum(out_toks))
    total_in = int(sum((r.prompt_tokens or 0) for r in ok))

    ttfts = [v for v in (ttft_s(r) for r in ok) if v is not None]
    tpots = [v for v in (tpot_s(r) for r in ok) if v is not None]
    e2es = [v for v in (e2e_s(r) for r in ok) if v is not None]
    itls: list[float] = []
    itl_tok: list[float] = []
    for r in ok:
        itls.extend(itl_s(r))
        itl_tok.extend(itl_per_token_s(r))

    errors_by: dict[str, int] = {}
    for r in bad:
        key = str(r.status) if r.status is not None else "no_response"
        errors_by[key] = errors_by.get(key, 0) + 1

    s: dict[str, Any] = {
        "completed": len(ok),
        "errors": len(bad),
        "errors_by_status": errors_by,
        "error_examples": sorted({(r.error or "")[:200] for r in bad})[:5],
        "duration_s": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "output_tok_s": total_out / duration_s if duration_s > 0 else None,
        # SGLang's input_throughput and total_throughput
        "input_tok_s": total_in / duration_s if duration_s > 0 else None,
        "total_tok_s": (total_in + total_out) / duration_s if duration_s > 0 else None,
        "output_tok_s_per_gpu": (total_out / duration_s / num_gpus) if duration_s > 0 else None,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else None,
        # SGLang's "Concurrency": the successful requests' summed E2E over the duration (the
        # mean number in flight, as the client saw them); `concurrency` stays the load's C
        "mean_concurrency": sum(e2es) / duration_s if duration_s > 0 else None,
        "num_gpus": num_gpus,
    }
    s.update(stats(ttfts, "ttft_ms", 1e3))
    s.update(stats(tpots, "tpot_ms", 1e3))
    s.update(stats(itls, "itl_ms", 1e3))
    s.update(stats(itl_tok, "itl_per_token_ms", 1e3))
    s.update(stats(e2es, "e2e_ms", 1e3))

    # post-wave: drop the first C submitted requests
    if post_wave_exclude is None:
        s.update(
            {
                "post_wave_exclude": None,
                "post_wave_completed": None,
                "post_wave_ttft_ms_mean": None,
                "post_wave_ttft_ms_p99": None,
                "post_wave_tpot_ms_mean": None,
                "post_wave_tpot_ms_p99": None,
            }
        )
    else:
        pw = [r for r in ok if r.index >= post_wave_exclude]
        pw_ttft = stats([v for v in (ttft_s(r) for r in pw) if v is not None], "x", 1e3)
        pw_tpot = stats([v for v in (tpot_s(r) for r in pw) if v is not None], "x", 1e3)
        s.update(
            {
                "post_wave_exclude": int(post_wave_exclude),
                "post_wave_completed": len(pw),
                "post_wave_ttft_ms_mean": pw_ttft["x_mean"],
                "post_wave_ttft_ms_p99": pw_ttft["x_p99"],
                "post_wave_tpot_ms_mean": pw_tpot["x_mean"],
                "post_wave_tpot_ms_p99": pw_tpot["x_p99"],
            }
        )

    # server-side timing decomposition
    # over the requests that have all three parts, so that the parts' means add up to theirs
    parts = []
    for r in ok:
        t = ttft_s(r)
        aw, ho = (r.timing or {}).get("alloc_wait_s"), (r.timing or {}).get("handoff_s")
        if t is not None and aw is not None and ho is not None:
            parts.append((aw, ho, t - aw - ho))
    s["alloc_wait_s_mean"] = _mean(p[0] for p in parts)
    s["handoff_s_mean"] = _mean(p[1] for p in parts)
    s["ttft_other_s_mean"] = _mean(p[2] for p in parts)

    s["active_mean"] = (
        active_mean(samples, t0 + epoch_offset, duration_s, active_metric)
        if samples and duration_s > 0
        else None
    )
    s["phases"] = (
        phase_stats(
            recs,
            phases,
            samples,
            epoch_offset=epoch_offset,
            host_metric=host_metric,
            total_metric=total_metric,
            active_metric=active_metric,
        )
        if phases
        else []
    )
    # Table A1's last row: a step down's final phase from the moment its in-flight count
    # returned to the phase's load (the higher load's requests drained), to its end
    if len(phases or ()) >= 2 and int(phases[-1]["concurrency"]) < int(phases[-2]["concurrency"]):
        last = phases[-1]
        t = recovery_time(recs, last)
        if t is not None:
            rec = _window_stats(
                recs,
                int(last["phase"]),
                t,
                float(last["end_mono"]),
                samples,
                epoch_offset=epoch_offset,
                host_metric=host_metric,
                total_metric=total_metric,
                active_metric=active_metric,
            )
            rec["recovered_after_s"] = t - float(last["start_mono"])
            s["phase_after_recovery"] = rec
    return s
