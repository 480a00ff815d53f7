"""Ratios between systems over repeat runs: the point estimate is the ratio of the two systems'
medians (what the figures plot), with a bootstrap 90% interval and the spread of the ratios
measured within one run group.

One config's output moved by up to 40% between GPU machines (HiSparse C128: 3,142-4,685 tok/s),
as much as the effects the paper reports, so a ratio without its interval says little. Where
the two systems ran as interleaved pairs (every run of one has exactly one partner of the other
with the same run group and ``repeat`` number: harness.reproduce's A B A B ... groups), the
bootstrap resamples the pairs, so that a machine's speed, which both runs of a pair share, does
not count as noise of the ratio; otherwise it resamples each system's repeats independently. It
takes the ratio of the resampled medians; the generator is seeded so that a report regenerates
byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.results import Run, run_value, values_by_run_group

INTERVAL = 0.90
RESAMPLES = 4000
SEED = 0
# fewer runs than this on either side give no interval (two runs give one: the resampled medians
# then take three values, so it spans their range)
MIN_RUNS = 2


@dataclass(frozen=True)
class RatioStats:
    point: float  # median(a) / median(b)
    lo: float | None  # bootstrap interval (None: fewer than MIN_RUNS on a side)
    hi: float | None
    runs: tuple[int, int]  # runs behind a and b
    group_ratios: tuple[float, ...]  # median(a) / median(b) within each run group that ran both
    paired: bool = False  # the interval resampled interleaved pairs (same run group and repeat)

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if self.lo is None or self.hi is None else (self.lo, self.hi)

    @property
    def spread(self) -> tuple[float, float] | None:
        """(lowest, highest) of the ratios measured within one run group, or None without any."""
        g = self.group_ratios
        return (min(g), max(g)) if g else None


def bootstrap_ratio(
    a: Sequence[float],
    b: Sequence[float],
    interval: float = INTERVAL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float] | None:
    """Percentile interval of median(a*) / median(b*) over bootstrap resamples a*, b* of ``a`` and
    ``b``; None when either has fewer than MIN_RUNS values."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < MIN_RUNS or len(b) < MIN_RUNS:
        return None
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(a, size=(resamples, len(a)), replace=True), axis=1)
    mb = np.median(rng.choice(b, size=(resamples, len(b)), replace=True), axis=1)
    return percentile_interval(ma / mb, interval)


def percentile_interval(ratios: np.ndarray, interval: float) -> tuple[float, float]:
    """The central ``interval`` of resampled ratios."""
    tail = 100.0 * (1.0 - interval) / 2.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return float(lo), float(hi)


def bootstrap_paired_ratio(
    pairs: Sequence[tuple[float, float]],
    interval: float = INTERVAL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float] | None:
    """Percentile interval of median(a*) / median(b*) where a*, b* are the two sides of one
    bootstrap resample of the (a, b) ``pairs``; None with fewer than MIN_RUNS pairs."""
    p = np.asarray(pairs, dtype=float)
    if p.ndim != 2 or len(p) < MIN_RUNS:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(p), size=(resamples, len(p)))
    return percentile_interval(
        np.median(p[idx, 0], axis=1) / np.median(p[idx, 1], axis=1), interval
    )


def repeat_pairs(a: Run, b: Run, key) -> list[tuple[float, float]] | None:
    """(a's value, b's value) for each interleaved pair of their repeats, matched by run group and
    ``repeat`` number; None unless every repeat on both sides has exactly one partner."""

    def keyed(run: Run) -> dict | None:
        out = {}
        for x in run.repeats or [run]:
            rep, v = x.config.get("repeat"), run_value(x, key)
            k = (x.run_group, rep)
            if rep is None or not x.run_group or v is None or k in out:
                return None
            out[k] = v
        return out

    ka, kb = keyed(a), keyed(b)
    if not ka or not kb or ka.keys() != kb.keys():
        return None
    return [(ka[k], kb[k]) for k in sorted(ka, key=str)]


def median_stats(values: Sequence[float]) -> RatioStats | None:
    """The median of ``values`` (each a ratio measured within one run, e.g. selections per
    distinct row) with its bootstrap interval, as a RatioStats against 1; None without values."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return None
    iv = bootstrap_ratio(v, [1.0] * len(v))
    return RatioStats(
        float(np.median(v)), iv[0] if iv else None, iv[1] if iv else None, (len(v), len(v)), ()
    )


def repeat_values(run: Run, key, scale: float = 1.0) -> list[float]:
    """``key`` (a summary key or a function of a run: ``run_value``) of every repeat of ``run``
    (the run alone when it has none)."""
    vals = (run_value(x, key) for x in (run.repeats or [run]))
    return [v * scale for v in vals if v is not None]


def argmax_with_ties(values: dict[Any, list[float]]) -> tuple[Any, tuple]:
    """The key with the highest median of its repeat values, and the other keys its repeats cannot
    be told apart from: those whose highest repeat reaches the best's lowest (ranges overlap).
    A claim such as "output peaks at B = 2k" holds only without such ties."""
    vals = {k: v for k, v in values.items() if v}
    if not vals:
        return None, ()
    best = max(vals, key=lambda k: float(np.median(vals[k])))
    floor = min(vals[best])
    return best, tuple(k for k in vals if k != best and max(vals[k]) >= floor)


def fewest_runs(values: dict[Any, list[float]]) -> int | None:
    """The fewest repeat values behind any candidate of an argmax (None without candidates)."""
    return min((len(v) for v in values.values() if v), default=None)


def tie_text(best, tied: Sequence, values: dict, name: str, unit: str = "tok/s") -> str:
    """The measured reason an argmax claim fails on a tie: each tied candidate's repeat range."""
    rng = {k: f"{min(values[k]):.0f}-{max(values[k]):.0f}" for k in (best, *tied)}
    return (
        f"{name} {best:g} ({rng[best]} {unit} over its repeats) is not told apart from "
        + ", ".join(f"{name} {k:g} ({rng[k]})" for k in tied)
        + ": the repeats' ranges overlap"
    )


def ratio_stats(a: Run | None, b: Run | None, key) -> RatioStats | None:
    """a / b for one summary key (or function of a run) over both runs' repeats, or None without
    values on both sides."""
    if a is None or b is None:
        return None
    va, vb = repeat_values(a, key), repeat_values(b, key)
    if not va or not vb or float(np.median(vb)) == 0:
        return None
    pairs = repeat_pairs(a, b, key)
    iv = bootstrap_paired_ratio(pairs) if pairs else bootstrap_ratio(va, vb)
    groups = values_by_run_group({"a": a, "b": b}, key)
    per_group = tuple(
        float(np.median(d["a"]) / np.median(d["b"]))
        for d in groups.values()
        if d.get("a") and d.get("b") and float(np.median(d["b"])) != 0
    )
    return RatioStats(
        float(np.median(va) / np.median(vb)),
        iv[0] if iv else None,
        iv[1] if iv else None,
        (len(va), len(vb)),
        per_group,
        paired=bool(pairs) and iv is not None,
    )


# issue 23's bound on the noise of one point measured within one call
SPREAD_TARGET = 0.10


def within_call_spread(run: Run | None, key: str) -> dict[str, tuple[float, int]]:
    """{run group: ((max - min) / median of ``key`` over the run's repeats in that group, runs)}
    for each group that measured the point at least twice: the noise of one config on one
    machine, which the effects a claim compares must exceed."""
    if run is None:
        return {}
    out = {}
    for group, d in values_by_run_group({"x": run}, key).items():
        v = d.get("x") or []
        if len(v) >= 2 and float(np.median(v)) > 0:
            out[group] = ((max(v) - min(v)) / float(np.median(v)), len(v))
    return out
