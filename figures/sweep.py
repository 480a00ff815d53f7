"""Plot any sweep of finished runs: output, TPOT and TTFT against load, one line per setting.

    python -m figures.sweep adhoc                       # results/adhoc/ (harness.run -m ...)
    python -m figures.sweep default_cpu --x input_len   # another x axis
    python -m figures.sweep fig9_h200 --results results --out /tmp/plots

The paper figures (``figures/fig*.py``) read the experiments they were written for; this reads
whatever an experiment directory holds, e.g. a Hydra multirun over a KV policy's knobs. A line is
one setting: system, then every setting the runs differ in (model, the hot-cache budget B, the
verification block K, optional residency, input and output length). Repeats of one setting and
load are folded into their median, with the spread listed in the table. Writes
``<out>/sweep-<experiment>.png`` and ``.md`` (every run's numbers); reads files only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from figures.plotting import subplots, system_color, system_label
from figures.report import DEFAULT_OUT, df_to_markdown
from harness.results import (
    DEFAULT_RESULTS,
    Run,
    as_float,
    find_key,
    finished_runs,
    hot_cache_rows_of,
    kv_config_of,
)

# (summary key, axis label, scale): what the panels plot
PANELS = (
    ("output_tok_s", "output (tok/s)", 1.0),
    ("tpot_ms_mean", "mean TPOT (ms)", 1.0),
    ("ttft_ms_mean", "mean TTFT (s)", 1e-3),
)
# settings that tell runs apart (beside the system), as a run's config names them
SETTINGS = {
    "model": lambda r: r.model,
    "B": lambda r: hot_cache_rows_of(r) or None,  # the system's own (resident: none)
    "K": lambda r: find_key(r.config.get("system") or {}, "block_size"),
    "residency": lambda r: kv_config_of(r).get("optional_residency"),
    "input": lambda r: find_key(r.config.get("workload") or {}, "input_len"),
    "output": lambda r: find_key(r.config.get("workload") or {}, "output_len"),
}
# the x axes (--x) and the setting each is, which a line's label then leaves out
X_AXES = {"concurrency": None, "input_len": "input", "B": "B", "K": "K"}


def describe(run: Run, x: str) -> dict:
    """A run's system, settings (SETTINGS) and x value."""
    settings = {name: get(run) for name, get in SETTINGS.items()}
    on_x = run.concurrency if X_AXES[x] is None else settings[X_AXES[x]]
    return {"system": run.system, "x": on_x, **settings}


def lines(runs: Sequence[Run], x: str) -> dict[tuple, dict]:
    """{line label: {x: [runs]}}: the label names the system and the settings that vary
    across the runs (one left out where every run has the same)."""
    rows = [(r, describe(r, x)) for r in runs]
    varying = [
        name for name in SETTINGS if name != X_AXES[x] and len({str(d[name]) for _, d in rows}) > 1
    ]
    out: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for r, d in rows:
        if d["x"] is None:
            continue
        label = (d["system"], *(f"{n}={d[n]}" for n in varying if d[n] is not None))
        out[label][d["x"]].append(r)
    return out


def _median(runs: Sequence[Run], key: str) -> float | None:
    vals = [v for v in (as_float(r.summary.get(key)) for r in runs) if v is not None]
    return statistics.median(vals) if vals else None


def draw(experiment: str, runs: Sequence[Run], x: str, out: Path, dpi: int = 150) -> Path:
    """The panels and the table; returns the image's path."""
    groups = lines(runs, x)
    fig, axes = subplots(1, len(PANELS), width=4.2, height=3.2)
    styles = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ("-", "v"), ("--", "P"))
    seen: dict[str, int] = defaultdict(int)
    for label in sorted(groups, key=str):
        system = label[0]
        style, marker = styles[seen[system] % len(styles)]  # a system's settings apart
        seen[system] += 1
        xs = sorted(groups[label])
        name = " ".join([system_label(system), *label[1:]])
        for ax, (key, ylabel, scale) in zip(axes[0], PANELS):
            ys = [_median(groups[label][v], key) for v in xs]
            pts = [(v, y * scale) for v, y in zip(xs, ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), style, marker=marker, color=system_color(system), label=name)
            ax.set_xlabel(x)
            ax.set_ylabel(ylabel)
    if x in ("concurrency", "B"):
        from matplotlib.ticker import ScalarFormatter

        for ax in axes[0]:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ScalarFormatter())
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{experiment}: {len(runs)} runs, one line per setting (median of repeats)")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"sweep-{experiment}.png"
    fig.savefig(png, dpi=dpi)
    table = [
        {
            "run": r.path.name,
            **describe(r, x),
            **{k: as_float(r.summary.get(k)) for k, _, _ in PANELS},
            "errors": r.summary.get("errors", 0),
            "commit": r.commit,
        }
        for r in runs
    ]
    import pandas as pd

    md = [
        f"# Sweep: {experiment}",
        "",
        f"![sweep]({png.name})",
        "",
        f"{len(runs)} finished runs under the experiment's directory; x = {x}. Lines fold "
        "repeats of one setting and x into their median.",
        "",
        df_to_markdown(pd.DataFrame(table)),
        "",
    ]
    (out / f"sweep-{experiment}.md").write_text("\n".join(md))
    return png


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m figures.sweep", description=__doc__.split("\n")[0])
    ap.add_argument("experiment", help="experiment name: the directory under --results")
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--x", choices=sorted(X_AXES), default="concurrency", help="the x axis")
    ap.add_argument("--dpi", type=int, default=150)
    args = ap.parse_args(argv)
    runs = finished_runs(args.results, args.experiment)
    if not runs:
        d = args.results / args.experiment
        have = (
            sorted(p.name for p in args.results.iterdir() if p.is_dir())
            if args.results.is_dir()
            else []
        )
        print(
            f"no finished runs under {d} (a run is finished once its summary.json is written); "
            f"experiments there: {', '.join(have) or 'none'}",
            file=sys.stderr,
        )
        return 1
    png = draw(args.experiment, runs, args.x, args.out, args.dpi)
    print(f"{len(runs)} runs -> {png} and {png.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
