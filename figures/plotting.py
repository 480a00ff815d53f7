"""Plotting helpers shared by the figure scripts: one color per KV policy (filled markers for the
speculative systems), the serving panels of Figs. 1 / 4 / 5, paper-vs-ours bars, and panels that
say plainly that nothing was measured."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

from figures.notes import provenance  # noqa: E402
from figures.paper_values import SYSTEM_LABELS  # noqa: E402
from figures.report import NOT_MEASURED, Report  # noqa: E402
from harness.results import SPECULATIVE, Run, by_system, canonical_system  # noqa: E402

PALETTE = sns.color_palette("colorblind", 8)


SYSTEM_COLORS = {
    "resident": PALETTE[7],
    "hisparse": PALETTE[0],
    "adaptive_hisparse": PALETTE[2],
    "resident_dflash2": PALETTE[7],
    "resident_dspark": PALETTE[7],
    "adaptive_dhisparse": PALETTE[2],
}


def system_label(name: str) -> str:
    return SYSTEM_LABELS.get(canonical_system(name), name)


def system_color(name: str):
    return SYSTEM_COLORS.get(canonical_system(name), PALETTE[4])


def setup_style() -> None:
    sns.set_theme(style="whitegrid", context="paper", font_scale=0.9)


def subplots(nrows: int, ncols: int, width: float = 4.0, height: float = 3.0, **kw):
    setup_style()
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw
    )
    return fig, axes


def panel_title(ax, letter: str, text: str) -> None:
    ax.set_title(f"{letter}  {text}", loc="left", fontsize=9, fontweight="bold")


def not_measured_panel(ax, what: str = "") -> None:
    """Draw an empty panel saying plainly that nothing was measured."""
    ax.set_facecolor("#f3f3f3")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.text(
        0.5,
        0.55,
        NOT_MEASURED.upper(),
        ha="center",
        va="center",
        fontsize=11,
        color="#888888",
        fontweight="bold",
        transform=ax.transAxes,
    )
    if what:
        ax.text(
            0.5,
            0.38,
            what,
            ha="center",
            va="center",
            fontsize=7,
            color="#888888",
            transform=ax.transAxes,
            wrap=True,
        )


def mark_unmeasured(ax, what: str = "ours") -> None:
    """Overlay on a panel that shows paper values only."""
    ax.text(
        0.5,
        0.95,
        f"{NOT_MEASURED.upper()} ({what})",
        transform=ax.transAxes,
        ha="center",
        va="top",
        color="#888888",
        fontweight="bold",
        fontsize=9,
    )


def plot_system_curve(
    ax, xs, ys, system: str, *, label: str | None = None, log_y: bool = False, linestyle: str = "-"
) -> None:
    filled = canonical_system(system) in SPECULATIVE
    ax.plot(
        xs,
        ys,
        linestyle=linestyle,
        marker="o",
        color=system_color(system),
        markerfacecolor=system_color(system) if filled else "white",
        label=label or system_label(system),
        markersize=5,
        linewidth=1.4,
    )
    if log_y:
        ax.set_yscale("log")


def serving_panels(
    axes: Sequence,
    runs: Sequence[Run],
    rep: Report,
    *,
    output_key: str,
    output_label: str,
    letters=("a", "b", "c"),
) -> bool:
    """The three panels of Figs. 1 / 4 / 5: output vs C, TTFT (log) vs output, TPOT vs output."""
    groups = by_system(runs)
    ax_a, ax_b, ax_c = axes
    if not groups:
        for ax, lt, what in zip(
            axes,
            letters,
            ("output vs offered concurrency", "mean TTFT vs output", "mean TPOT vs output"),
        ):
            not_measured_panel(ax, what)
            rep.panel(lt, f"{NOT_MEASURED} ({what})")
        panel_title(ax_a, letters[0], "Output vs offered concurrency")
        panel_title(ax_b, letters[1], "Mean TTFT (log) vs output")
        panel_title(ax_c, letters[2], "Mean TPOT vs output")
        return False
    for sys_, rs in groups.items():
        pts = [
            (r.concurrency, r.num(output_key), r.num("ttft_ms_mean"), r.num("tpot_ms_mean"))
            for r in rs
            if r.concurrency is not None
        ]
        pts = [p for p in pts if p[1] is not None]
        if not pts:
            continue
        c, o, t, tp = zip(*pts)
        plot_system_curve(ax_a, c, o, sys_)
        tt = [(oo, x / 1e3) for oo, x in zip(o, t) if x is not None]
        if tt:
            plot_system_curve(ax_b, *zip(*tt), sys_, log_y=True)
        tpp = [(oo, x) for oo, x in zip(o, tp) if x is not None]
        if tpp:
            plot_system_curve(ax_c, *zip(*tpp), sys_)
    cs = sorted({r.concurrency for r in runs if r.concurrency})
    if cs and cs[-1] / max(cs[0], 1) >= 8:
        ax_a.set_xscale("log", base=2)
        ax_a.set_xticks(cs)
        ax_a.set_xticklabels([str(c) for c in cs])
    ax_a.set_xlabel("Offered concurrency (requests)")
    ax_a.set_ylabel(output_label)
    ax_b.set_xlabel(output_label)
    ax_b.set_ylabel("Mean time to first token (s)")
    ax_c.set_xlabel(output_label)
    ax_c.set_ylabel("Mean time per output token (ms)")
    panel_title(ax_a, letters[0], "Output vs offered concurrency")
    panel_title(ax_b, letters[1], "Mean TTFT (log) vs output")
    panel_title(ax_c, letters[2], "Mean TPOT vs output")
    legend(ax_a)
    n = len(runs)
    for lt in letters:
        rep.panel(lt, f"measured ({n} runs)")
    rep.measured_with = provenance(runs)
    return True


def paper_vs_ours_bars(
    ax,
    categories: Sequence[str],
    paper: Sequence[float | None],
    ours: Sequence[float | None],
    ylabel: str = "",
    log: bool = False,
    colors: Sequence | None = None,
) -> None:
    """Side-by-side bars: hatched = paper, solid = ours (missing ours drawn as an 'n/m' mark)."""
    x = np.arange(len(categories))
    w = 0.38
    colors = list(colors) if colors is not None else [PALETTE[0]] * len(categories)
    pv = [np.nan if p is None else float(p) for p in paper]
    ov = [np.nan if o is None else float(o) for o in ours]
    ax.bar(x - w / 2, pv, w, color="white", edgecolor=colors, hatch="///", label="paper")
    ax.bar(x + w / 2, ov, w, color=colors, label="ours")
    for i, o in enumerate(ov):
        if np.isnan(o):
            ax.text(
                x[i] + w / 2,
                0,
                "n/m",
                ha="center",
                va="bottom",
                fontsize=6,
                color="#888888",
                rotation=90,
            )
    ax.set_xticks(x)
    ax.set_xticklabels(categories, rotation=20, ha="right", fontsize=7)
    if all(np.isnan(o) for o in ov):
        mark_unmeasured(ax)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)


def legend(ax, **kw) -> None:
    """ax.legend() only when something carries a label (no warning on empty panels)."""
    h, _ = ax.get_legend_handles_labels()
    if h:
        ax.legend(fontsize=7, frameon=False, **kw)
