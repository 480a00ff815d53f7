"""Fig. 10 - what the cache costs inside a step, Adaptive HiSparse at C128: (a) cache-kernel work
per step (resolver, follower-layer copies) against B/k for both model families; (b) share of step
time by kernel family, each family counted where it runs alone.

Per model family, the profiles on the H200 preset derived from the paper where they exist
(results/fig10_h200/ GLM-like at paper C128 = ours C32, results/fig10_dsv_h200/ DeepSeek-like at
paper C128 = ours C64; the splits CUDA-graph replay folds together from fig10_eager_h200 /
fig10_dsv_eager_h200), else the scaled presets' at our C128: results/fig10/summary.json
{"points": [{model, b_over_k, resolver_ms, follower_copy_ms, step_ms, sessions_per_step,
partition_pct}]}, or the kernel profile ({"step_ms", "sessions_per_step", "cache_kernel_ms":
{"resolver", "follower_copy"}, "partition_pct": {family: percent}}) of the Adaptive HiSparse C128
runs of results/fig10*, fig9*.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import seaborn as sns

from figures import common as C
from figures.fig9 import at_paper_c128, family, select, sweep
from figures.paper_values import FIG10_FAMILIES, PAPER, label
from harness.load_mapping import decode_gpus, load_label

NAME = "fig10"
PAPER_BUDGET = {"glm": 2.0, "deepseek": 16.0}


# the profiled experiments on the H200 presets derived from the paper: (served, CUDA graphs off)
H200_EXPERIMENTS = {
    "glm": ("fig10_h200", "fig10_eager_h200"),
    "deepseek": ("fig10_dsv_h200", "fig10_dsv_eager_h200"),
}


def h200_points(results, fam: str, eager: bool = False) -> list:
    """The family's Adaptive HiSparse profiles at the paper's C128 on its H200 preset (ours C32
    GLM-like, C64 DeepSeek-like), one per budget."""
    return at_paper_c128(
        results, H200_EXPERIMENTS[fam][1 if eager else 0], fam, "adaptive_hisparse"
    )


# the scaled presets' profiled experiments: (served, CUDA graphs off)
MINI_EXPERIMENTS = {"glm": ("fig10", "fig10_eager"), "deepseek": ("fig10_dsv", "fig10_dsv_eager")}


def family_load(results, fam: str) -> tuple[str, str, str, bool] | None:
    """(a row's label: 'paper C128 = ours C32, glm53_h200' or 'ours C128, glm53_mini', the load
    in full: 'paper C128 = ours C32 on one H200, glm53_h200', the served profiles' experiment,
    on an H200 preset) of the family's profiles: its H200 preset's at the paper's C128 where it
    has any, else the scaled preset's at our C128 (a higher per-GPU load, which the full label
    says); None without either."""
    pts = h200_points(results, fam)
    on_h200 = bool(pts)
    if not pts:
        pts = select(sweep(results, ("fig10", "fig10_dsv")) + sweep(results), fam, None, 128)
    if not pts:
        return None
    r = pts[0].run
    exp = (H200_EXPERIMENTS if on_h200 else MINI_EXPERIMENTS)[fam][0]
    short = f"paper C128 = ours C{r.concurrency}" if on_h200 else f"ours C{r.concurrency}"
    full = load_label(128, r.concurrency, decode_gpus(r.model))
    return f"{short}, {r.model}", f"{full}, {r.model}", exp, on_h200


def _entry(prof: dict, sp) -> dict:
    ck = prof.get("cache_kernel_ms") or {}
    return {
        "resolver_ms": C.as_float(ck.get("resolver")),
        "follower_copy_ms": C.as_float(ck.get("follower_copy")) or 0.0,
        "step_ms": C.as_float(prof.get("step_ms")),
        "sessions": C.as_float(prof.get("sessions_per_step")) or sp.run.num("active_mean"),
        "partition": prof.get("partition_pct") or {},
        "graphs": C.graphs_replayed(sp.run),
        "prov": C.provenance(sp.run),
    }


def profiles(results, skipped: list[str] | None = None) -> dict[tuple[str, float], dict]:
    """(family, B/k) -> {resolver_ms, follower_copy_ms, step_ms, sessions, partition, prov}; a profile
    not taken under its run's load is left out (its reason appended to ``skipped``). A family
    with profiles on its H200 preset takes only those (one preset per family's curve)."""
    out: dict = {}
    skipped = [] if skipped is None else skipped
    on_h200 = set()
    for fam in H200_EXPERIMENTS:
        for sp in h200_points(results, fam):
            on_h200.add(fam)  # even where no profile is at load: never mixed with the mini's
            prof = C.profile_at_load(sp.run, skipped)
            if prof and (fam, sp.bk) not in out:
                out[(fam, sp.bk)] = _entry(prof, sp)
    S = C.load_json(results / NAME / "summary.json") or {}
    for p in S.get("points") or []:
        fam, bk = family(str(p.get("model", ""))), C.as_float(p.get("b_over_k"))
        if fam and bk and fam not in on_h200:
            out[(fam, bk)] = {
                "resolver_ms": C.as_float(p.get("resolver_ms")),
                "follower_copy_ms": C.as_float(p.get("follower_copy_ms")) or 0.0,
                "step_ms": C.as_float(p.get("step_ms")),
                "sessions": C.as_float(p.get("sessions_per_step")),
                "partition": p.get("partition_pct") or {},
                "prov": C.summary_provenance(S, "results/fig10/summary.json"),
            }
    # the profiled runs of their own (results/fig10, fig10_dsv) first, then any fig9 run with a profile
    pts = sweep(results, ("fig10", "fig10_dsv")) + sweep(results)
    for sp in select(pts, "glm", "adaptive_hisparse", 128) + select(
        pts, "deepseek", "adaptive_hisparse", 128
    ):
        if (sp.family, sp.bk) in out or sp.family in on_h200:
            continue
        prof = C.profile_at_load(sp.run, skipped)
        if prof:
            out[(sp.family, sp.bk)] = _entry(prof, sp)
    return out


# families that replayed graphs fold into one (the expert matmuls run inside the graph)
MERGED_UNDER_GRAPHS = ("expert matrix products", "dense projections")


def step_composition(results, fam: str) -> str | None:
    """The served step's composition on the family's H200 preset at the paper's C128 and budget
    (its Adaptive HiSparse kernel profile), against the paper's Fig. 10b, as a measured reason for
    a throughput claim of the same preset: weights' matrix products, indexing and attention,
    other model kernels. None without such a profile."""
    pts = [p for p in h200_points(results, fam) if p.bk == PAPER_BUDGET[fam]]
    prof = C.profile_at_load(pts[0].run, []) if pts else None
    part = (prof or {}).get("partition_pct") or {}
    if not part:
        return None
    P = PAPER["fig10"]["partition_pct"][fam]
    share = lambda keys: sum(C.as_float(part.get(k)) or 0.0 for k in keys)  # noqa: E731
    paper = lambda keys: sum(float(P[k]) for k in keys)  # noqa: E731
    parts = (
        ("weight matrix products", MERGED_UNDER_GRAPHS),
        ("indexing and attention", ("indexing and attention",)),
        ("other model kernels", ("other model kernels",)),
    )
    r = pts[0].run
    return (
        f"{r.model}'s served step at {load_label(128, r.concurrency, decode_gpus(r.model))} "
        f"({H200_EXPERIMENTS[fam][0]}'s profile): "
        + ", ".join(f"{n} {share(k):.0f} % (paper {paper(k):.0f} %)" for n, k in parts)
    )


def eager_profiles(results, skipped: list[str]) -> dict[str, dict]:
    """family -> the GLM-like (or DeepSeek-like) C128 profile at the paper's budget taken with CUDA
    graphs off (results/fig10_eager, fig10_dsv_eager): the two splits graph replay folds together
    (follower-layer copy vs resolver, expert vs dense-projection matmuls). Its step time is not the
    served one."""
    out = {}
    for fam in ("glm", "deepseek"):
        # the served profiles' preset: the eager split is a proportion applied to their steps
        cands = (
            h200_points(results, fam, eager=True)
            if h200_points(results, fam)
            else select(
                sweep(results, ("fig10_eager", "fig10_dsv_eager")), fam, "adaptive_hisparse", 128
            )
        )
        for sp in cands:
            if abs(sp.bk - PAPER_BUDGET[fam]) > 1e-6 or C.graphs_replayed(sp.run):
                continue
            prof = C.profile_at_load(sp.run, skipped)
            if not prof:
                continue
            out[fam] = {
                "partition": prof.get("partition_pct") or {},
                "cache": prof.get("cache_kernel_ms") or {},
                "prov": C.provenance(sp.run) + ", CUDA graphs off",
            }
    return out


# served runs of Fig. 10's system at the paper's C128 on the GLM-like H200 preset (paper C128 =
# ours C32): their GPU time without a decode step, beside the profile's "no kernel running"
SERVED_EXPERIMENT = "fig4_h200"


def served_idle(results) -> tuple[float, C.Run] | None:
    """(percent of the GPU's serving time with no decode step on it, the run), median over the
    repeats of fig4_h200's Adaptive HiSparse at paper C128, from the server's CUDA events
    (harness.results.gpu_idle_share), or None without such a run."""
    for r in C.load_runs(results, SERVED_EXPERIMENT):
        if r.system != "adaptive_hisparse" or r.paper_concurrency != 128:
            continue
        vals = [v for v in (C.gpu_idle_share(x) for x in (r.repeats or [r])) if v is not None]
        if vals:
            return 100 * float(np.median(vals)), r
    return None


# the served engine thread's host profile at fig5_h200's top load (profile=host)
HOST_EXPERIMENT = "fig10_host_h200"


# a sample's innermost frame in one of torch's synchronize wrappers: waiting for the device
_SYNC_FRAME = r":synchronize@"


# the event loop's innermost frame while it polls: asyncio's select, or on uvloop (which polls in
# C) the asyncio.Runner.run that called into it
LOOP_POLL = r":select@|runners\.py:\d+:run@"


def _share(rows: list[dict], pattern: str) -> float:
    """The share of a thread's samples whose innermost frame matches ``pattern``."""
    return sum(r["share"] for r in rows if re.search(pattern, r["function"]))


def host_table(results) -> pd.DataFrame | None:
    """Per profiled system of fig10_host_h200: where the engine thread's and the event loop's
    wall time went over the sampled window (profiling/host.py), or None without a profile."""
    rows = []
    for r in C.load_runs(results, HOST_EXPERIMENT):
        path = r.path / "host" / "host_profile.json"
        if not path.is_file():
            continue
        prof = json.loads(path.read_text())
        threads = {t["thread"]: t for t in prof.get("threads", [])}
        eng, loop = threads.get("engine"), threads.get("MainThread")
        if prof.get("engine_process"):  # MainThread receives the server's messages: no loop
            loop = None
        if eng is None:
            continue
        # innermost frames are disjoint: the synchronize wrappers' own shares add up
        wait = _share(eng["by_own_time"], _SYNC_FRAME)
        busy = [
            f"{x['function'].split('@')[0]} {x['ms_per_step']:.2f}"
            for x in eng["by_own_time"]
            if not re.search(_SYNC_FRAME, x["function"])
        ][:3]
        rows.append(
            {
                "system": label(r.system),
                "running": round(prof["mean_running"], 1),
                "wall ms / step": round(prof["wall_ms_per_step"], 2),
                "engine: waiting for the device %": round(100 * wait, 1),
                "engine: CPU / wall %": (
                    None
                    if prof.get("cpu_share_of_wall") is None
                    else round(100 * prof["cpu_share_of_wall"], 1)
                ),
                # every server before 221df4d ran on asyncio, and its profiles do not say so
                "event loop": prof.get("event_loop") or "asyncio",
                # server.engine_process: the loop ran in the server's process, off the engine's
                # GIL, and was not sampled
                "engine process": "own" if prof.get("engine_process") else "the server's",
                "event loop busy %": (
                    round(100 * (1 - _share(loop["by_own_time"], LOOP_POLL)), 1) if loop else None
                ),
                "engine's busiest functions (own ms / step)": "; ".join(busy),
                "syncs / step": round(prof.get("syncs_per_step") or 0, 2),
                # profiling/host.py weighs each sample by the time it stands for; before that
                # every sample counted alike, which over-weights waits
                "samples": "time-weighted" if "sampled_ms_per_step" in eng else "unweighted",
                "commit": r.commit,
            }
        )
    return pd.DataFrame(rows) if rows else None


def main(argv=None) -> C.Report:
    args = C.parse_args(NAME, __doc__, argv)
    skipped: list[str] = []
    prof = profiles(args.results, skipped)
    eager = eager_profiles(args.results, skipped)
    where = {fam: family_load(args.results, fam) for fam in H200_EXPERIMENTS}
    h200 = [bool(w and w[3]) for w in where.values()]
    presets = (
        "H200 presets derived from the paper"
        if all(h200)
        else "H200 and scaled presets"
        if any(h200)
        else "scaled presets"
    )
    rep = C.Report(
        NAME,
        f"Fig. 10 - The cache's cost in a step, Adaptive HiSparse at C128 (ours: {presets})",
    )
    # no one loads line: the two families map the paper's C128 for different decode GPUs (and
    # may run on different presets), so each row says its family's load

    def at(fam: str) -> str:
        """The family's load and preset after a row's quantity."""
        return f" ({where[fam][0]})" if where[fam] else ""

    for fam, w in where.items():
        if w:
            rep.note(
                f"{'GLM' if fam == 'glm' else 'DeepSeek'}-like rows: kernel profiles at {w[1]} "
                f"({w[2]}{', one run per budget' if w[3] else ' and the profiled runs of Fig. 9'})."
            )
    eager_name = {
        fam: (H200_EXPERIMENTS if w and w[3] else MINI_EXPERIMENTS)[fam][1]
        for fam, w in where.items()
    }
    P = PAPER["fig10"]
    fig, axes = C.subplots(1, 2, width=4.6, height=3.2)

    # ---------------- panel a
    ax = axes[0][0]
    x, ticks, labels = 0.0, [], []
    drew = False
    for fam, budgets in (("glm", (1, 2, 4, 8)), ("deepseek", (2, 4, 8, 16))):
        for bk in budgets:
            pp = P["cache_ms_per_step"][fam][str(bk)]
            ax.bar(
                x - 0.2,
                pp,
                0.38,
                color="white",
                edgecolor=C.PALETTE[0],
                hatch="///",
                label="paper (total)" if (fam, bk) == ("glm", 1) else None,
            )
            o = prof.get((fam, float(bk)))
            if o and o["resolver_ms"] is not None:
                drew = True
                ax.bar(
                    x + 0.2,
                    o["resolver_ms"],
                    0.38,
                    color=C.PALETTE[0],
                    label="ours: resolver" if not labels else None,
                )
                ax.bar(
                    x + 0.2,
                    o["follower_copy_ms"],
                    0.38,
                    bottom=o["resolver_ms"],
                    color=C.PALETTE[1],
                    label="ours: follower-layer copy" if not labels else None,
                )
            else:  # a budget without a profile says so where its bar would be
                ax.text(x + 0.2, 0, "n/m", ha="center", va="bottom", fontsize=6, rotation=90)
            ticks.append(x)
            labels.append(f"{'GLM' if fam == 'glm' else 'DS'} {bk}")
            x += 1
        x += 0.6
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=7, rotation=30)
    ax.set_xlabel("Hot-cache budget B/k")
    ax.set_ylabel("Cache kernel work (ms per step)")
    C.legend(ax)
    if not drew:
        C.mark_unmeasured(ax)
    C.panel_title(ax, "a", "Cache work against the budget, paper C128")
    rep.panel("a", "measured" if drew else f"{C.NOT_MEASURED} (profiles of the C128 sweep)")

    # ---------------- panel b
    ax = axes[0][1]
    bars = []
    for fam in ("glm", "deepseek"):
        bars.append((f"{'GLM' if fam == 'glm' else 'DeepSeek'} paper", P["partition_pct"][fam]))
        o = prof.get((fam, PAPER_BUDGET[fam]))
        if o is None:  # nearest budget we profiled
            cands = [k for k in prof if k[0] == fam]
            o = (
                prof[min(cands, key=lambda k: abs(np.log2(k[1] / PAPER_BUDGET[fam])))]
                if cands
                else None
            )
        bars.append(
            (f"{'GLM' if fam == 'glm' else 'DeepSeek'} ours", (o or {}).get("partition") or {})
        )
    colors = dict(zip(FIG10_FAMILIES, sns.color_palette("Set2", len(FIG10_FAMILIES))))
    have_b = False
    for yi, (lab, part) in enumerate(bars):
        left = 0.0
        for famk in FIG10_FAMILIES:
            v = C.as_float(part.get(famk))
            if v is None:
                continue
            have_b |= "ours" in lab
            ax.barh(
                yi,
                v,
                left=left,
                color=colors[famk],
                hatch="///" if "paper" in lab else None,
                edgecolor="white",
                label=famk if yi == 0 else None,
            )
            left += v
        if not part:
            ax.text(1, yi, C.NOT_MEASURED, va="center", fontsize=7, color="#888888")
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b[0] for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("Share of step time (%)")
    ax.legend(fontsize=6, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    C.panel_title(ax, "b", "Where a paper-C128 step goes")
    rep.panel("b", "measured" if have_b else f"{C.NOT_MEASURED} (kernel-family partition)")
    fig.tight_layout()

    # ---------------- comparisons
    for fam, budgets in (("glm", (1, 2, 4, 8)), ("deepseek", (2, 4, 8, 16))):
        for bk in budgets:
            o = prof.get((fam, float(bk)))
            tot = (
                None
                if not o or o["resolver_ms"] is None
                else o["resolver_ms"] + o["follower_copy_ms"]
            )
            rep.compare(
                f"{fam}.cache_ms.{bk}",
                f"{'GLM' if fam == 'glm' else 'DeepSeek'} cache work per step, B/k = {bk}{at(fam)}",
                P["cache_ms_per_step"][fam][str(bk)],
                tot,
                "ms",
                (o or {}).get("prov", ""),
            )
    o = prof.get(("glm", 2.0))
    share, share_prov = None, (o or {}).get("prov", "")
    ck = (eager.get("glm") or {}).get("cache") or {}
    res_e, cp_e = C.as_float(ck.get("resolver")), C.as_float(ck.get("follower_copy")) or 0.0
    if res_e is not None and res_e + cp_e > 0:  # the eager profile keeps the two apart
        share, share_prov = cp_e / (res_e + cp_e), eager["glm"]["prov"]
    elif o and o.get("graphs"):
        rep.note(
            "GLM follower-copy share: not measured with CUDA graphs replayed (the profiled runs' "
            "follower copies count as resolver work; cache work per step is their sum either way); "
            f"the {eager_name['glm']} experiment (engine.disable_cuda_graph=true) measures the split."
        )
    elif o and o["resolver_ms"] is not None and (o["resolver_ms"] + o["follower_copy_ms"]) > 0:
        share = o["follower_copy_ms"] / (o["resolver_ms"] + o["follower_copy_ms"])
    rep.compare(
        "glm.copy_share",
        f"GLM follower-copy share of cache work at 2k{at('glm')}",
        P["glm_follower_copy_share"],
        share,
        "",
        share_prov,
    )
    for bk in (2, 4, 8):
        o = prof.get(("glm", float(bk)))
        v = None
        if o and o["resolver_ms"] is not None and o["sessions"]:
            v = (o["resolver_ms"] + o["follower_copy_ms"]) / o["sessions"]
        rep.compare(
            f"glm.per_session.{bk}",
            f"GLM cache work per session, B/k = {bk}{at('glm')}",
            P["glm_cache_ms_per_session"][str(bk)],
            v,
            "ms",
            (o or {}).get("prov", ""),
        )
    for fam in ("glm", "deepseek"):
        o = prof.get((fam, PAPER_BUDGET[fam])) or {}
        rep.compare(
            f"{fam}.step_ms",
            f"{'GLM' if fam == 'glm' else 'DeepSeek'} step time at B/k = "
            f"{C.fmt(PAPER_BUDGET[fam])}{at(fam)}",
            P["step_ms"][fam],
            o.get("step_ms"),
            "ms",
            o.get("prov", ""),
        )
        part = o.get("partition") or {}
        name = "GLM" if fam == "glm" else "DeepSeek"
        split_from = {}  # family -> (value, provenance) where the graph-replayed profile cannot tell
        if o.get("graphs") and part:
            # replayed graphs fold the expert matmuls into dense projections: compare their sum
            ours = sum(C.as_float(part.get(k)) or 0.0 for k in MERGED_UNDER_GRAPHS)
            theirs = sum(float(P["partition_pct"][fam][k]) for k in MERGED_UNDER_GRAPHS)
            part = {k: v for k, v in part.items() if k not in MERGED_UNDER_GRAPHS}
            rep.note(
                f"{name} step share of expert matrix products + dense projections together: paper "
                f"{C.fmt(theirs)} %, ours {C.fmt(ours)} % (CUDA graphs replayed in the profiled run, so "
                "the two are one family there)."
            )
            e = eager.get(fam)
            ev = [
                C.as_float((e or {}).get("partition", {}).get(k)) or 0.0
                for k in MERGED_UNDER_GRAPHS
            ]
            if e and sum(ev) > 0:
                # the served step's merged share, split in the proportion the eager step shows (the
                # eager shares themselves are of a longer step with launch gaps)
                split_from = {
                    k: (ours * v / sum(ev), e["prov"]) for k, v in zip(MERGED_UNDER_GRAPHS, ev)
                }
                rep.note(
                    f"{name} expert / dense-projection shares: the served step's merged share split in "
                    f"the proportion the profile with CUDA graphs off shows ({100 * ev[0] / sum(ev):.0f}% "
                    f"expert; {eager_name[fam]})."
                )
        for famk, pv in P["partition_pct"][fam].items():
            v, pr = split_from.get(famk, (C.as_float(part.get(famk)), o.get("prov", "")))
            rep.compare(
                f"{fam}.partition.{famk}", f"{name} step share{at(fam)}: {famk}", pv, v, "%", pr
            )
    for fam in ("glm", "deepseek"):
        o = prof.get((fam, PAPER_BUDGET[fam])) or {}
        idle = C.as_float((o.get("partition") or {}).get("no kernel running"))
        if idle is not None and idle > 10 and o.get("step_ms"):
            # the scaled presets' steps are a few ms of short kernels; the H200 presets' are not
            why = (
                ""
                if where[fam]
                else ": the scaled presets' kernels are short, so the engine's host-side work "
                "between graph replays (scheduling, sampling, host backups, in Python) is a "
                "large part of each step here"
            )
            rep.note(
                f"{'GLM' if fam == 'glm' else 'DeepSeek'}: no kernel runs for {C.fmt(idle)} % of a "
                f"{C.fmt(o['step_ms'])} ms step (paper "
                f"{C.fmt(float(P['partition_pct'][fam]['no kernel running']))} %){why}."
            )
    served = served_idle(args.results)
    if served:
        rep.compare(
            "glm.served_no_step_pct",
            "GLM served: GPU time with no decode step (paper C128 = ours C32 on one H200; events)",
            P["partition_pct"]["glm"]["no kernel running"],
            served[0],
            "%",
            C.provenance(served[1]),
        )
        rep.note(
            "GLM served idle share: 1 - dhs_decode_gpu_share of fig4_h200's Adaptive HiSparse runs "
            "at paper C128 (median over repeats). Not the paper's quantity: the events span a "
            "step's own gaps between kernels, and admission's copies between steps count as no "
            "step."
        )
    host = host_table(args.results)
    if host is not None:
        rep.table(
            "Host side of the served step: DeepSeek-like, paper C512 = ours C256 on one H200 "
            "(fig10_host_h200, profile=host: every thread's stack sampled over 300 decoded "
            "steps; not a measurement of the systems' output)",
            host,
        )
        rep.note(
            "Host table: a step the GPU spends without a kernel is one the host has not "
            "launched. 'Waiting for the device' is the engine thread's share of samples inside "
            "a synchronize (reading the previous step's tokens: the GPU is the bound then); "
            "the event loop is busy outside its poll (asyncio's select, or uvloop's C loop; a "
            "loop back from its poll but waiting for the GIL still counts as in it). uvloop "
            "reads and writes sockets in that C loop too, which counts as idle, so the busy "
            "shares of the two loops are not comparable. Unweighted samples over-weight waits; even "
            "weighted, busy Python code reads low at Python's 5 ms switch interval "
            "(profiling/host.py). The paper gives no host numbers."
        )
    rep.note_reasons(skipped)
    rep.measured_with = "; ".join(sorted({v["prov"] for v in prof.values() if v.get("prov")}))
    rep.note(
        "Paper panel (b) labels are partly ambiguous in the flattened text; see "
        "figures/paper_values.py AMBIGUITIES['fig10.partition_pct']."
    )
    return rep.finish(fig, args)


if __name__ == "__main__":
    main()
