"""Table 1 - memory per session (GPU required at two contexts, host backup), computed.

Reads nothing under results/: every value comes from figures/capacity.py, for the paper's
GLM-5.3 geometry (compared cell by cell with the paper) and for our scaled presets
(conf/model/glm53_mini.yaml, dsv41_mini.yaml; pool size from conf/hardware/h200.yaml), and from
figures/presets.py for the derivation of the H200 presets (glm53_h200, dsv41_h200: panels e, f).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from figures import capacity as cap
from figures import common as C
from figures import presets as derived
from figures.paper_values import PAPER, PV, SYSTEM_LABELS

NAME = "table1"
METHOD_TO_SYSTEM = {
    "resident": "resident",
    "hisparse": "hisparse",
    "adaptive_hisparse": "adaptive_hisparse",
    "resident_drafter": "resident_dflash2",
    "adaptive_dhisparse": "adaptive_dhisparse",
}
PRESETS = ("glm53_mini", "dsv41_mini")
COMPUTED = "computed (capacity.py, paper geometry)"


def preset_contexts(cfg) -> dict[str, int]:
    """Long context: the largest power of two below max_context_len - 2,048 (32K for glm53_mini,
    64K for dsv41_mini); short context: the paper's 32K/100K proportion of it, page-rounded."""
    long_ = 1 << int(math.floor(math.log2(max(cfg.max_context_len - 2048, 2))))
    short = cap.page_round(int(long_ * 32_768 / 100_000), cfg.page_size)
    return {f"{short // 1024}k": short, f"{long_ // 1024}k": long_}


def hardware_pool_gib(name: str = "h200") -> float | None:
    p = C.REPO / "conf" / "hardware" / f"{name}.yaml"
    d = C.load_yaml(p)
    return C.as_float(d.get("kv_pool_gib"))


# served non-speculative runs of each H200 preset at its budget, across loads: what the measured
# load-independent share of a step is fitted on (one system per preset, as its experiments run it)
MEASURED_STEP_RUNS = {
    "glm53_h200": (("fig4_h200_sweep", "hisparse"), ("fig4_h200", "hisparse")),
    "dsv41_h200": (("fig11b_h200", "adaptive_hisparse"), ("fig10_dsv_h200", "adaptive_hisparse")),
}


def measured_fixed_share(results, preset: str) -> tuple[float, float, float, list] | None:
    """(share, intercept ms, ms per running request, runs): the rule's time structure as served.
    A line through (mean running requests, ms per step) of the preset's served runs at its budget,
    loads up to its batch at the paper's C128 (+10 %), graph-capturing steps left out; its
    intercept is the step's load-independent part (weights, and any fixed per-step cost), the
    paper's reading of Table A3's TPOT slope. The share is the intercept over the fitted step at
    that batch. None with fewer than two loads."""
    d = derived.DEPLOYMENTS[preset]
    B = derived.hot_cache_rows(preset)
    pts, runs = [], []
    for exp, system in MEASURED_STEP_RUNS.get(preset, ()):
        for r in C.load_runs(results, exp):
            # a run that sets no budget ran the system's default, the preset's B unless the
            # deployment names its own
            hc = C.hot_cache_rows_of(r) or (0 if d.hot_cache_rows else B)
            if r.system != system or r.model != preset or hc != B:
                continue
            sc = C.step_cost(r, exclude_capture=True)
            if sc and sc[1] <= 1.1 * d.batch:
                pts.append((sc[1], sc[0]))
                runs.append(r)
    if len({round(b) for b, _ in pts}) < 2:
        return None
    slope, icpt = np.polyfit([b for b, _ in pts], [ms for _, ms in pts], 1)
    step = icpt + slope * d.batch
    if step <= 0:
        return None
    return float(icpt / step), float(icpt), float(slope), runs


def main(argv=None) -> C.Report:
    args = C.parse_args(NAME, __doc__, argv)
    rep = C.Report(NAME, "Table 1 - Memory per session (GLM-5.3 geometry and our presets)")
    rep.measured_with = "figures/capacity.py (computed; no GPU run involved)"
    g = cap.paper_glm53_geometry()
    t1 = cap.table1(g)
    paper = PAPER["table1"]

    # ---------------------------------------------------------------- paper geometry, per cell
    cols = (
        ("gpu_32k", "GPU required, 32K"),
        ("gpu_100k", "GPU required, 100K"),
        ("host_100k", "host backup, 100K"),
    )
    for meth, row in t1.items():
        sys_ = METHOD_TO_SYSTEM[meth]
        for col, what in cols:
            pv = paper.get(sys_, {}).get(col)
            if pv is None:
                continue
            rep.compare(
                f"{sys_}.{col}", f"{SYSTEM_LABELS[sys_]}: {what}", pv, row[col], "GiB", COMPUTED
            )
    s34 = PAPER["sec34"]
    gpu = lambda m, t=100_000: cap.session_memory(g, m, t).gpu_required  # noqa: E731
    rep.compare(
        "resident_over_adaptive",
        "resident / adaptive GPU memory at 100K",
        paper["text"]["resident_over_adaptive_100k"],
        gpu("resident") / gpu("adaptive_hisparse"),
        "x",
        COMPUTED,
    )
    rep.compare(
        "ring_rows",
        "draft ring rows R_d (eq. 9)",
        s34["ring_rows_R_d"],
        cap.ring_rows(2048, 64, 8),
        "rows",
        COMPUTED,
    )
    rep.compare(
        "ring_gib_session",
        "draft ring per session",
        paper["text"]["ring_gib_per_session"],
        g.ring_rows * g.draft.bytes_per_row / cap.GIB,
        "GiB",
        COMPUTED,
    )
    rep.compare(
        "ring_gib_gpu",
        "draft ring, 35 slots",
        s34["ring_gib_per_gpu_35_slots"],
        cap.ring_gib_per_gpu(g, 35),
        "GiB",
        COMPUTED,
    )
    rep.compare(
        "staging_78",
        "staging, one arena per layer (78), 35 slots",
        s34["staging_gib_dedicated_78"],
        cap.staging_gib_per_gpu(g, 35, chi=78),
        "GiB",
        COMPUTED,
    )
    rep.compare(
        "staging_4",
        "staging, 4 reused arenas, 35 slots (eq. 11)",
        s34["staging_gib_reused_4"],
        cap.staging_gib_per_gpu(g, 35),
        "GiB",
        COMPUTED,
    )
    rep.compare(
        "spec_state",
        "ring + staging per session",
        s34["spec_state_gib_per_session"],
        cap.spec_state_gib_per_session(g),
        "GiB",
        COMPUTED,
    )
    rep.compare(
        "hot_cache_mb",
        "hot cache per session (Table 3)",
        PAPER["table3"]["glm"]["hot_cache_mb_per_session"],
        sum(g.hot_cache_rows) * g.row_bytes / 1e6,
        "MB",
        COMPUTED,
    )
    rep.compare(
        "histories_without",
        "index pool 5.37 M rows: complete histories",
        s34["histories_without"],
        cap.index_pool_histories(5.37e6, 100_000, 2048, 64),
        "",
        COMPUTED,
    )
    rep.compare(
        "histories_with",
        "index pool 3.72 M rows: complete histories",
        s34["histories_with_drafter"],
        cap.index_pool_histories(3.72e6, 100_000, 2048, 64),
        "",
        COMPUTED,
    )
    rep.compare(
        "resident_in_52",
        "resident sessions in the memory of 52 offloaded",
        s34["resident_sessions_in_52_offloaded"],
        cap.sessions_per_gpu(52 * gpu("adaptive_hisparse"), gpu("resident")),
        "",
        COMPUTED,
    )
    rep.compare(
        "resident_in_35",
        "Resident+DFlash2 sessions in the memory of 35 ADHS",
        s34["resident_sessions_in_35_offloaded_dflash2"],
        cap.sessions_per_gpu(35 * gpu("adaptive_dhisparse"), gpu("resident_drafter")),
        "",
        COMPUTED,
    )
    host = cap.session_memory(g, "hisparse", 100_000).host_backup
    rep.compare(
        "host_208",
        "host backup of 208 sessions",
        s34["host_tb_208_sessions"],
        208 * host / 1e12,
        "TB",
        COMPUTED,
    )
    rep.compare(
        "host_fit",
        "sessions a 4.3 TB host holds",
        s34["host_sessions_fit"],
        4.3e12 / host,
        "",
        COMPUTED,
    )

    comp = cap.session_memory(g, "adaptive_dhisparse", 100_000).components
    rep.table(
        "Components of one Adaptive DHiSparse session at 100K (paper geometry)",
        pd.DataFrame({"component": list(comp), "MiB": [v / 2**20 for v in comp.values()]}),
    )
    rep.note(
        "Paper geometry: d_KV = 576 B (the paper's accounting; 656 B is the stored FP8 row), "
        "21 x 132 B index keys per token, histories page-rounded to 64, '100K' = 100,000 and "
        "'32K' = 32,768 tokens of context (output excluded). Derivation in the docstring of "
        "figures/capacity.py."
    )

    # ---------------------------------------------------------------- our presets
    pool_gib = hardware_pool_gib("h200")
    preset_rows = []
    preset_tables = {}
    for name in PRESETS:
        try:
            mcfg = cap.load_model_config(name)
        except Exception as e:  # noqa: BLE001 - a preset being edited must not break the table
            rep.note(f"preset {name} could not be loaded: {e}")
            continue
        pg = cap.preset_geometry(name)
        ctx = preset_contexts(mcfg)
        tab = cap.table1(pg, ctx)
        preset_tables[name] = (ctx, tab)
        long_lab = max(ctx, key=ctx.get)
        for meth, row in tab.items():
            d = {"preset": name, "method": SYSTEM_LABELS[METHOD_TO_SYSTEM[meth]]}
            d.update(
                {
                    k.replace("gpu_", "GPU GiB ").replace("host_", "host GiB "): v
                    for k, v in row.items()
                }
            )
            if pool_gib:
                req = cap.session_memory(pg, meth, ctx[long_lab]).gpu_required
                d[f"sessions in {pool_gib:g} GiB pool ({long_lab})"] = cap.sessions_per_gpu(
                    pool_gib * cap.GIB, req
                )
            preset_rows.append(d)
        ratio = (
            cap.session_memory(pg, "resident", ctx[long_lab]).gpu_required
            / cap.session_memory(pg, "adaptive_hisparse", ctx[long_lab]).gpu_required
        )
        if name.startswith("glm"):  # Table 1 is GLM-5.3's; the DeepSeek preset is listed only
            rep.compare(
                f"{name}.resident_over_adaptive",
                f"{name}: resident / adaptive GPU memory at {long_lab}",
                paper["text"]["resident_over_adaptive_100k"],
                ratio,
                "x",
                f"computed (capacity.py, scaled preset {name})",
            )
        df = pd.DataFrame([r for r in preset_rows if r["preset"] == name]).drop(columns="preset")
        rep.table(
            f"Scaled preset {name} (computed with the engine's {pg.row_bytes}-byte rows; "
            f"drafter assumed: {pg.draft.bytes_per_row} B per ring row, "
            f"R_d = {pg.ring_rows}; chi = {pg.chi})",
            df.astype(object).fillna("—"),
        )

    # ---------------------------------------------------------------- H200 presets (derived)
    derivations = {}
    for name in derived.DEPLOYMENTS:
        try:
            rows = derived.derivation(name)
        except Exception as e:  # noqa: BLE001 - a preset being edited must not break the table
            rep.note(f"preset {name} could not be derived: {e}")
            continue
        derivations[name] = rows
        prov = f"computed (figures/presets.py step model and pool sizing, preset {name})"
        for r in rows:
            paper_v = None if r.paper is None else PV(r.paper, r.source)
            if r.paper_range:
                paper_v = {"lo": PV(r.paper_range[0], r.source), "hi": PV(r.paper_range[1], "")}
            rep.compare(
                f"preset.{name}.{r.key}", f"{name}: {r.quantity}", paper_v, r.ours, "", prov
            )
        rep.table(
            f"Derivation of {name} (docs/presets.md; band: what tests/figures/test_presets.py "
            "holds it to)",
            pd.DataFrame(
                {
                    "quantity": [r.quantity for r in rows],
                    "paper": [r.paper_text for r in rows],
                    "ours": [r.ours for r in rows],
                    "ours/paper": [r.ratio for r in rows],
                    "band": [
                        "—" if r.band is None else f"{C.fmt(r.band[0])}–{C.fmt(r.band[1])}"
                        for r in rows
                    ],
                }
            )
            .astype(object)
            .fillna("—"),
        )

    # the time structure as served: the rule's band against the presets' measured steps
    for name in derived.DEPLOYMENTS:
        got = measured_fixed_share(args.results, name)
        if got:  # Table 1 is otherwise computed: a row only where the runs exist
            lo, hi = derived.PAPER_FIXED_SHARE
            rep.compare(
                f"preset.{name}.fixed_share_measured",
                f"{name}: load-independent share of a step at paper C128, measured",
                {"lo": PV(lo, "Table A3 slope, Fig. 10b"), "hi": PV(hi, "")},
                got[0],
                "",
                C.provenance(got[3]),
            )
            d = derived.DEPLOYMENTS[name]
            rep.note(
                f"{name}, measured time structure: served steps of {len(got[3])} runs at their "
                f"budget fit {got[1]:.2f} ms + {got[2]:.3f} ms per running request, so at "
                f"{d.batch} requests (paper C128) the load-independent part is {got[0]:.0%} of "
                f"the step (the rule's band {lo:.0%}-{hi:.0%}; the derivation's model puts the "
                "weights alone there)."
            )

    # ---------------------------------------------------------------- figure
    fig, axes = C.subplots(3, 2, width=4.6, height=3.0)
    for ax, (col, what), lt in zip((axes[0][0], axes[0][1], axes[1][0]), cols, "abc"):
        meths = [m for m in t1 if paper.get(METHOD_TO_SYSTEM[m], {}).get(col) is not None]
        syss = [METHOD_TO_SYSTEM[m] for m in meths]
        C.paper_vs_ours_bars(
            ax,
            [SYSTEM_LABELS[s] for s in syss],
            [paper[s][col] for s in syss],
            [t1[m][col] for m in meths],
            "GiB per session",
            colors=[C.system_color(s) for s in syss],
        )
        C.panel_title(ax, lt, f"GLM-5.3 geometry: {what}")
        rep.panel(lt, "computed from the paper's geometry")
    C.legend(axes[0][0])
    ax = axes[1][1]
    if preset_tables:
        x0 = 0
        ticks, labels = [], []
        for name, (ctx, tab) in preset_tables.items():
            for meth, row in tab.items():
                sys_ = METHOD_TO_SYSTEM[meth]
                for j, lab in enumerate(ctx):
                    ax.bar(
                        x0 + 0.4 * j,
                        row[f"gpu_{lab}"],
                        0.38,
                        color=C.system_color(sys_),
                        alpha=0.45 + 0.55 * j,
                        edgecolor="black",
                        linewidth=0.3,
                    )
                ticks.append(x0 + 0.2)
                labels.append(f"{name}: {SYSTEM_LABELS[sys_]}")
                x0 += 1
            x0 += 0.5
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=6)
        ax.set_yscale("log")
        from matplotlib.ticker import NullFormatter

        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("GiB per session")
        ax.text(
            0.99,
            0.97,
            "light: short, dark: long context",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=7,
        )
        rep.panel("d", "computed from our presets")
    else:
        C.not_measured_panel(ax, "presets not loadable")
        rep.panel("d", f"{C.NOT_MEASURED} (presets not loadable)")
    C.panel_title(ax, "d", "Our scaled presets: GPU required (computed)")
    for ax, (lt, name) in zip(axes[2], zip("ef", derived.DEPLOYMENTS)):
        rows = [r for r in derivations.get(name, []) if r.ratio is not None]
        if not rows:
            C.not_measured_panel(ax, "preset not derivable")
            rep.panel(lt, f"{C.NOT_MEASURED} (preset {name} not derivable)")
        else:
            y = range(len(rows))
            ax.barh(
                list(y),
                [r.ratio for r in rows],
                color=[C.PALETTE[0] if r.in_band else C.PALETTE[3] for r in rows],
            )
            ax.axvline(1.0, color="black", linewidth=0.6)
            ax.set_yticks(list(y))
            ax.set_yticklabels([r.quantity for r in rows], fontsize=6)
            ax.invert_yaxis()
            ax.set_xlabel("ours / paper")
            rep.panel(lt, f"computed from the derivation of {name} (figures/presets.py)")
        C.panel_title(ax, lt, f"{name}: derived per decode GPU (model)")
    fig.tight_layout()
    return rep.finish(fig, args)


if __name__ == "__main__":
    main()
