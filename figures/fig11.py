"""Fig. 11 - where step time goes: (a) GLM-like with DFlash2 at C64, mean profiled round time for
static blocks of 4 and 6 as an exclusive partition by kernel family; (b) DeepSeek-like without
speculation, resolver kernel work as a share of the step interval at C16 (fill, middle, drain) and
C512 under pressure.

Reads results/fig11/summary.json {"round_ms": {"4": {family: ms, ..., ["total"]}, "6": {...}},
"resolver_share_pct": {"C16 fill": .., "C16 middle": .., "C16 drain": .., "C512 pressure": ..}},
or profile.json files with the same keys in results/fig11/<run>/ (point.block for round_ms); panel (b)
also from the per-cycle kernel profiles of results/fig11b/ (conf/experiment/fig11b.yaml: the lowest
load split into fill / middle / drain, the top load's full-batch part as "under pressure").
"""

from __future__ import annotations

import statistics

import seaborn as sns

from figures import common as C
from figures.paper_values import FIG11_FAMILIES, PAPER
from harness.load_mapping import DEEPSEEK_DECODE_GPUS, decode_gpus, load_label, ours_concurrency

NAME = "fig11"


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def eager_of(exp: str) -> str:
    """The CUDA-graphs-off companion of a panel-a experiment: fig11 -> fig11_eager,
    fig11_h200 -> fig11_eager_h200 (its split applies to rounds of the same preset only)."""
    return NAME + "_eager" + exp[len(NAME) :]


def collect(results):
    # panel a from fig11_h200 (the GLM-like H200 preset) where it has runs, else fig11 (mini);
    # panel b from fig11b_h200 (the DeepSeek-like H200 preset) where it has runs, else the
    # scaled preset's sources: each panel's own, so neither follows the other's preset
    exp, a_runs = C.load_preferred(results, NAME)
    bexp, b_runs = C.load_preferred(results, "fig11b")
    b_runs = [r for r in b_runs if r.concurrency]
    S = C.load_json(results / exp / "summary.json") or {}
    rounds = {str(k): v for k, v in (S.get("round_ms") or {}).items() if isinstance(v, dict)}
    heads = [C.summary_provenance(S, f"results/{exp}/summary.json")] if S else []
    # the scaled preset's other panel-b sources: results/fig11/summary.json, fig11's runs
    # labelled like a paper bar; none where fig11b_h200 has runs
    legacy = not bexp.endswith(C.H200_SUFFIX)
    S_b = (
        (S if exp == NAME else C.load_json(results / NAME / "summary.json") or {}) if legacy else {}
    )
    shares = dict(S_b.get("resolver_share_pct") or {})
    if S_b and S_b is not S:
        heads.append(C.summary_provenance(S_b, f"results/{NAME}/summary.json"))
    head = "; ".join(heads)
    provs, skipped = [], []
    profs: dict = {}

    def prof_of(r):
        if r.path not in profs:
            profs[r.path] = C.profile_at_load(r, skipped)
        return profs[r.path]

    for r in a_runs:
        prof = prof_of(r)
        if not prof:
            continue
        if C.graphs_replayed(r) and prof.get("round_ms"):
            # replayed graphs fold the expert matmuls into "other model kernels": not a split to report
            prof = {
                **prof,
                "round_ms": {**prof["round_ms"], "expert matrix products": None, "graphs": True},
            }
        b = r.cfg("block", "block_size")
        if isinstance(prof.get("round_ms"), dict) and b is not None and str(int(b)) not in rounds:
            rounds[str(int(b))] = prof["round_ms"]
            provs.append(r)
    for r in (a_runs if exp == NAME else C.load_runs(results, NAME)) if legacy else []:
        prof = prof_of(r)
        if not prof:
            continue
        for k, v in (
            (prof.get("resolver_share_pct") or {}).items()
            if isinstance(prof.get("resolver_share_pct"), dict)
            else ()
        ):
            shares.setdefault(k, v)
        # a serving profile labelled like a paper bar ("C16 fill", "c16-fill", "C512_pressure")
        lab = _norm(str(r.cfg("phase_label") or r.tag))
        for k in PAPER["fig11"]["resolver_share_pct"]:
            if _norm(k) == lab and C.as_float(prof.get("resolver_share_pct")) is not None:
                shares.setdefault(k, C.as_float(prof["resolver_share_pct"]))
                provs.append(r)
    # rounds profiled with replayed graphs: their model kernels split into expert matmuls and the rest
    # in the proportion the same round shows with CUDA graphs off (conf/experiment/fig11_eager.yaml)
    for r in C.load_runs(results, eager_of(exp)):
        b = r.cfg("block", "block_size")
        part = rounds.get(str(int(b))) if b is not None else None
        if not part or not part.get("graphs") or C.graphs_replayed(r):
            continue
        prof = prof_of(r)
        if not prof:
            continue
        e = prof.get("round_ms") or {}
        ex, ot = (
            C.as_float(e.get("expert matrix products")) or 0.0,
            C.as_float(e.get("other model kernels")) or 0.0,
        )
        model = C.as_float(part.get("other model kernels"))
        if ex + ot > 0 and model is not None:
            frac = ex / (ex + ot)
            rounds[str(int(b))] = {
                **part,
                "expert matrix products": model * frac,
                "other model kernels": model * (1 - frac),
                "expert_share_eager": frac,
            }
            provs.append(r)
    # Fig. 11b from conf/experiment/fig11b*.yaml: per-cycle profiles over a whole run, by phase
    note = ""
    if b_runs:
        low, top = b_loads(b_runs)
        for r in b_runs:
            ph = phase_shares(r)
            if r.concurrency == low:
                for name in ("fill", "middle", "drain"):
                    key = next(
                        (k for k in PAPER["fig11"]["resolver_share_pct"] if k.endswith(name)), None
                    )
                    if key and ph.get(name) is not None:
                        shares.setdefault(key, ph[name])
                        provs.append(r)
            elif r.concurrency == top and top != low and ph.get("middle") is not None:
                key = next(
                    (k for k in PAPER["fig11"]["resolver_share_pct"] if k.endswith("pressure")),
                    None,
                )
                if key:
                    shares.setdefault(key, ph["middle"])
                    provs.append(r)
        note = (
            f"Panel b from results/{bexp}: the C16 phases at our C{low}, split by the batch each profiled "
            f"cycle carried (fill: before it first reached C{low}, or, where the closed loop admitted all C{low} "
            f"at once, the leading cycles whose steps ran their prefills (over {FILL_STEP_FACTOR:g}x the median "
            f"cycle's step time); drain: after it last held C{low}), and "
            f"'C512 pressure' as the cycles from the first to the last full batch at our top load, C{top} "
            f"(conf/experiment/{bexp}.yaml maps the paper's C512 there)."
        )
    # one deduplicated tag list (a tag per run repeated every preset and device name)
    return (
        rounds,
        shares,
        "; ".join(x for x in (head, C.provenance(provs) if provs else "") if x),
        note,
        skipped,
        (exp, a_runs),
        (bexp, b_runs),
    )


FILL_STEP_FACTOR = 3.0


def b_loads(b_runs) -> tuple[int, int]:
    """(low, top) load of Fig. 11b's runs: the experiment's loads (its config: ours, or the
    paper's mapped to ours), not the runs present, so a lone top-load run does not fill the
    low-load rows."""
    loads = set()
    for r in b_runs:
        w = r.config.get("workload") or {}
        loads |= {int(c) for c in w.get("concurrency") or []}
        gpus = decode_gpus(r.model)
        loads |= {ours_concurrency(int(c), gpus) for c in w.get("paper_concurrency") or []}
    loads = sorted(loads or {r.concurrency for r in b_runs})
    return loads[0], loads[-1]


def phase_shares(run) -> dict[str, float]:
    """Resolver share of the step (%) by phase of one run profiled in cycles over its whole length
    (kernels/kernel_summary.json ``cycles``, each with the mean batch it carried): fill = cycles
    before the batch first reaches the run's concurrency C, drain = cycles after it last held C,
    middle = the cycles from its first to its last full batch (where the batch is full from the first
    cycle, the fill is the leading prefill-heavy cycles instead). Phases are step-weighted means."""
    ks = C.load_json(run.path / "kernels" / "kernel_summary.json") or {}
    # cycles that decoded something (a last partial cycle can hold steps without a batch)
    cyc = [
        c
        for c in ks.get("cycles") or []
        if c.get("num_steps")
        and (C.as_float(c.get("sessions_per_step")) or 0) > 0
        and C.as_float(c.get("resolver_share_pct_mean")) is not None
    ]
    if not cyc or not run.concurrency:
        return {}
    full = [i for i, c in enumerate(cyc) if float(c["sessions_per_step"]) >= run.concurrency - 0.5]
    if not full:
        return {}
    start = full[0]
    if start == 0:
        # a closed loop admits all C requests at once, so the batch is full from the first cycle:
        # the fill is then the leading cycles that ran the admissions' prefills, told by a mean
        # step time over FILL_STEP_FACTOR x the run's median cycle
        med = statistics.median(float(c.get("step_ms") or 0.0) for c in cyc)
        while (
            start < full[-1]
            and med > 0
            and float(cyc[start].get("step_ms") or 0.0) > FILL_STEP_FACTOR * med
        ):
            start += 1
    parts = {"fill": cyc[:start], "middle": cyc[start : full[-1] + 1], "drain": cyc[full[-1] + 1 :]}
    out = {}
    for name, cs in parts.items():
        n = sum(int(c["num_steps"]) for c in cs)
        if n:
            out[name] = (
                sum(float(c["resolver_share_pct_mean"]) * int(c["num_steps"]) for c in cs) / n
            )
    return out


def main(argv=None) -> C.Report:
    args = C.parse_args(NAME, __doc__, argv)
    rounds, shares, prov, b_note, skipped, (exp, a_runs), (bexp, b_runs) = collect(args.results)
    on_h200 = [e.endswith(C.H200_SUFFIX) for e in (exp, bexp)]
    presets = (
        "H200 presets derived from the paper"
        if all(on_h200)
        else "H200 and scaled presets"
        if any(on_h200)
        else "scaled presets"
    )
    rep = C.Report(NAME, f"Fig. 11 - Where step time goes (ours: {presets})")
    a_loads = sorted({r.concurrency for r in a_runs if r.concurrency})
    if a_loads:  # panel a's load in the paper's terms (the report's loads line is panel b's)
        rep.note(
            f"Panel a from results/{exp}: "
            + "; ".join(load_label(64, c) for c in a_loads)
            + " (the paper's Fig. 11a is at C64)."
        )
    if b_runs:  # panel b: the paper's C16 phases and C512 under pressure
        low, top = b_loads(b_runs)
        rep.loads = {16: low, 512: top}
        rep.decode_gpus = DEEPSEEK_DECODE_GPUS  # panel b's loads: the DeepSeek-like runs
    P = PAPER["fig11"]
    fig, axes = C.subplots(1, 2, width=4.6, height=3.0)
    colors = dict(zip(FIG11_FAMILIES, sns.color_palette("Set2", len(FIG11_FAMILIES))))

    ax = axes[0][0]
    bars = [
        ("block 4 paper", P["round_ms"]["4"]),
        ("block 4 ours", rounds.get("4") or {}),
        ("block 6 paper", P["round_ms"]["6"]),
        ("block 6 ours", rounds.get("6") or {}),
    ]
    have = False
    for yi, (lab, part) in enumerate(bars):
        left = 0.0
        for famk in FIG11_FAMILIES:
            v = C.as_float(part.get(famk))
            if v is None:
                continue
            have |= "ours" in lab
            ax.barh(
                yi,
                v,
                left=left,
                color=colors[famk],
                hatch="///" if "paper" in lab else None,
                edgecolor="white",
                label=famk if yi == 0 else None,
            )
            if v >= 8:
                ax.text(left + v / 2, yi, C.fmt(v), ha="center", va="center", fontsize=6)
            left += v
        if left:
            ax.text(left + 1, yi, C.fmt(left), va="center", fontsize=7)
        else:
            ax.text(1, yi, C.NOT_MEASURED, va="center", fontsize=7, color="#888888")
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b[0] for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("Profiled round time (ms)")
    ax.legend(fontsize=6, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    C.panel_title(ax, "a", "GLM-like with DFlash2, paper C64")
    rep.panel("a", "measured" if have else f"{C.NOT_MEASURED} (round partition)")

    ax = axes[0][1]
    keys = list(P["resolver_share_pct"])
    C.paper_vs_ours_bars(
        ax,
        keys,
        [P["resolver_share_pct"][k] for k in keys],
        [C.as_float(shares.get(k)) for k in keys],
        "Resolver kernel work (% of step)",
    )
    C.legend(ax)
    C.panel_title(ax, "b", "DeepSeek-like, no speculation")
    rep.panel(
        "b",
        "measured"
        if any(C.as_float(shares.get(k)) is not None for k in keys)
        else f"{C.NOT_MEASURED} (resolver share of the step)",
    )
    fig.tight_layout()

    def total(part):
        if not part:
            return None
        t = C.as_float(part.get("total"))
        return (
            t
            if t is not None
            else sum(C.as_float(part.get(f)) or 0.0 for f in FIG11_FAMILIES) or None
        )

    for b in ("4", "6"):
        part = rounds.get(b) or {}
        rep.compare(
            f"b{b}.total",
            f"block {b}: round time",
            P["round_ms"][b]["total"],
            total(part),
            "ms",
            prov,
        )
        for famk in FIG11_FAMILIES:
            rep.compare(
                f"b{b}.{famk}",
                f"block {b}: {famk}",
                P["round_ms"][b][famk],
                C.as_float(part.get(famk)),
                "ms",
                prov,
            )
        t = total(part)
        ca = C.as_float(part.get("cache kernels alone"))
        rep.compare(
            f"b{b}.cache_share",
            f"block {b}: cache kernels alone, share of the round",
            PAPER["fig7"][f"cache_alone_share_b{b}_pct"],
            None if not t or ca is None else 100 * ca / t,
            "%",
            prov,
        )
    if any((rounds.get(b) or {}).get("graphs") for b in ("4", "6")):
        for b in ("4", "6"):
            part = rounds.get(b) or {}
            if part.get("expert_share_eager") is not None:
                rep.note(
                    f"Block {b}: the served round's model kernels (CUDA graphs replayed) are split into expert "
                    f"matrix products and the rest in the proportion the same round shows with CUDA graphs off "
                    f"({eager_of(exp)}: {100 * part['expert_share_eager']:.0f}% expert)."
                )
            elif part.get("graphs"):
                pp = P["round_ms"][b]
                rep.note(
                    f"Block {b}: expert matrix products + other model kernels together: paper "
                    f"{C.fmt(pp['expert matrix products'] + pp['other model kernels'])} ms, ours "
                    f"{C.fmt(C.as_float(part.get('other model kernels')))} ms (CUDA graphs replayed in the "
                    "profiled run fold the expert matmuls into the other model kernels)."
                )
    rep.compare(
        "round_b6_over_b4",
        "round time, block 6 vs 4",
        PAPER["fig7"]["C64"]["round_b6_over_b4_pct"],
        C.pct_change(total(rounds.get("6")), total(rounds.get("4"))),
        "%",
        prov,
    )
    for k in keys:
        rep.compare(
            f"share.{k}",
            f"resolver share of the step, {k}",
            P["resolver_share_pct"][k],
            C.as_float(shares.get(k)),
            "%",
            prov,
        )
    rep.measured_with = prov
    if b_note:
        rep.note(b_note)
    rep.note_reasons(skipped)
    rep.note(
        "The paper's segment-to-category mapping of panel (a) is inferred from the flattened "
        "text; see figures/paper_values.py AMBIGUITIES['fig11.round_ms']."
    )
    return rep.finish(fig, args)


if __name__ == "__main__":
    main()
