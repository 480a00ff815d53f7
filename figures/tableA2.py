"""Table A2 - where first-token latency goes: allocation wait, handoff and the rest, for all
requests and after the first wave (the first C submitted excluded), at C128 and C256.

Reads results/fig4/<run>/: summary.json (alloc_wait_s_mean, handoff_s_mean, ttft_other_s_mean,
ttft_ms_mean) and records.jsonl (per-request server timing, for the post-wave split: TTFT and
its parts from each repeat's own records, each part's median over the repeats).
"""

from __future__ import annotations

from figures import common as C
from figures.notes import median_over_repeats
from figures.paper_values import PAPER, label

NAME = "tableA2"
SYSTEMS = ("hisparse", "adaptive_hisparse", "adaptive_dhisparse")
PARTS = (("alloc_wait_s", "allocation wait"), ("handoff_s", "handoff"), ("other_s", "other"))


def ours_split(r: C.Run | None) -> tuple[dict, dict]:
    if r is None:
        return {}, {}
    allr = {
        "alloc_wait_s": r.num("alloc_wait_s_mean"),
        "handoff_s": r.num("handoff_s_mean"),
        "other_s": r.num("ttft_other_s_mean"),
        "ttft_s": None if r.num("ttft_ms_mean") is None else r.num("ttft_ms_mean") / 1e3,
    }
    # each repeat's post-wave split from its own records, then each part's median over the
    # repeats, as the all-requests row takes each part's median of the repeats' summaries
    pw = median_over_repeats(r, lambda x: C.timing_split(x, post_wave=True) if x.records else None)
    return allr, pw or {}


def main(argv=None) -> C.Report:
    args = C.parse_args(NAME, __doc__, argv)
    runs = C.load_runs(args.results, "fig4")
    rep = C.Report(NAME, "Table A2 - TTFT split at C128 / C256 (ours: GLM-like scaled preset)")
    rep.loads = {c: c for c in (128, 256) if any(r.concurrency == c for r in runs)}
    P = PAPER["tableA2"]
    fig, axes = C.subplots(1, 2, width=5.0, height=3.2)
    shares_ours: dict = {}
    for i, cl in enumerate(("C128", "C256")):
        c = int(cl[1:])
        ax = axes[0][i]
        xt, xl = [], []
        have = False
        for j, sys_ in enumerate(SYSTEMS):
            r = C.pick(runs, sys_, c)
            prov = C.provenance(r) if r else ""
            allr, pw = ours_split(r)
            pp = P[cl][sys_]
            for k, what in PARTS + (("ttft_s", "TTFT"),):
                rep.compare(
                    f"{cl}.{sys_}.{k}", f"{cl} {label(sys_)}: {what}", pp[k], allr.get(k), "s", prov
                )
            for k, what in (
                ("alloc_wait_s", "allocation wait"),
                ("handoff_s", "handoff"),
                ("ttft_s", "TTFT"),
            ):
                rep.compare(
                    f"{cl}.{sys_}.post_wave_{k}",
                    f"{cl} {label(sys_)}: after first wave, {what}",
                    pp[f"post_wave_{k}"],
                    pw.get(k),
                    "s",
                    prov,
                )
            # stacked shares of TTFT: paper bar, then ours
            for off, src, tt in (
                (-0.2, {k: pp[k] for k, _ in PARTS}, pp["ttft_s"]),
                (0.2, allr, allr.get("ttft_s")),
            ):
                bottom = 0.0
                for n, (k, what) in enumerate(PARTS):
                    v = src.get(k)
                    if v is None or not tt:
                        continue
                    have |= off > 0
                    sh = 100.0 * v / tt
                    ax.bar(
                        j + off,
                        sh,
                        0.38,
                        bottom=bottom,
                        color=C.PALETTE[n],
                        hatch="///" if off < 0 else None,
                        edgecolor="white",
                        label=what if (j == 0 and off < 0) else None,
                    )
                    bottom += sh
            if allr.get("ttft_s"):
                shares_ours[(cl, sys_)] = {
                    k: 100 * (allr.get(k) or 0) / allr["ttft_s"] for k, _ in PARTS
                }
            xt.append(j)
            xl.append(f"{label(sys_)}\n(paper | ours)")
        ax.set_xticks(xt)
        ax.set_xticklabels(xl, fontsize=7)
        ax.set_ylabel("share of mean TTFT (%)")
        C.panel_title(ax, "ab"[i], f"{cl}: TTFT split (hatched: paper)")
        if i == 0:
            C.legend(ax)
        rep.panel("ab"[i], "measured" if have else f"{C.NOT_MEASURED} ({cl} runs)")
        if not have:
            C.mark_unmeasured(ax)
    T = P["text"]
    g = lambda cl, s, k: shares_ours.get((cl, s), {}).get(k)  # noqa: E731
    prov = C.provenance([r for r in runs if r.concurrency in (128, 256)])
    rep.compare(
        "handoff_share_hisparse_C128",
        "handoff share of HiSparse TTFT at C128",
        T["handoff_share_hisparse_c128_pct"],
        g("C128", "hisparse", "handoff_s"),
        "%",
        prov,
    )
    rep.compare(
        "handoff_share_adaptive_C128",
        "handoff share of Adaptive HiSparse TTFT at C128",
        T["handoff_share_adaptive_c128_pct"],
        g("C128", "adaptive_hisparse", "handoff_s"),
        "%",
        prov,
    )
    rep.compare(
        "handoff_share_adhs_C128",
        "handoff share of ADHS TTFT at C128",
        T["handoff_share_adhs_c128_pct"],
        g("C128", "adaptive_dhisparse", "handoff_s"),
        "%",
        prov,
    )
    rep.compare(
        "alloc_share_adhs_C128",
        "allocation-wait share of ADHS TTFT at C128",
        T["alloc_share_adhs_c128_pct"],
        g("C128", "adaptive_dhisparse", "alloc_wait_s"),
        "%",
        prov,
    )
    ho = lambda s: C.summary_value(runs, s, 128, "handoff_s_mean")  # noqa: E731
    rep.compare(
        "handoff_shortening_adaptive",
        "HiSparse / Adaptive HiSparse handoff at C128",
        T["handoff_shortening_adaptive"],
        C.ratio(ho("hisparse"), ho("adaptive_hisparse")),
        "x",
        prov,
    )
    rep.compare(
        "handoff_shortening_adhs",
        "HiSparse / ADHS handoff at C128",
        T["handoff_shortening_adhs"],
        C.ratio(ho("hisparse"), ho("adaptive_dhisparse")),
        "x",
        prov,
    )
    for s in ("adaptive_hisparse", "adaptive_dhisparse"):
        rep.compare(
            f"alloc_share_{s}_C256",
            f"allocation-wait share of {label(s)} TTFT at C256",
            T["alloc_share_adaptive_c256_pct"],
            g("C256", s, "alloc_wait_s"),
            "%",
            prov,
        )
    rep.compare(
        "alloc_share_hisparse_C256",
        "allocation-wait share of HiSparse TTFT at C256",
        T["alloc_share_hisparse_c256_pct"],
        g("C256", "hisparse", "alloc_wait_s"),
        "%",
        prov,
    )
    rep.measured_with = prov
    fig.tight_layout()
    return rep.finish(fig, args)


if __name__ == "__main__":
    main()
