"""Fig. 5 - DeepSeek-like serving at very long context: panels and encoding as in Fig. 4, with
DSpark as the drafter.

Reads results/fig5/<run>/summary.json (one run per system and concurrency; optional extra runs
at other input lengths carry ``point.input_len`` for the context-length crossover). The headline
ratio at the paper's C512 comes from results/fig5_h200/ (the DeepSeek-like H200 preset, paper
C512 = ours C256, interleaved repeats) where it has runs of both systems there.
"""

from __future__ import annotations

from figures import common as C
from figures.fig10 import step_composition
from figures.paper_values import PAPER
from harness.load_mapping import DEEPSEEK_DECODE_GPUS

NAME = "fig5"
OUT = "output_tok_s_per_gpu"
# the headline claim, a / b at the paper's C512: from fig5_h200 where it has both systems there
HEADLINE_KEY = "adhs_vs_resident_dspark_C512"
HEADLINE = ("adaptive_dhisparse", "resident_dspark")


def main(argv=None) -> C.Report:
    args = C.parse_args(NAME, __doc__, argv)
    allruns = C.load_runs(args.results, NAME)
    lens = sorted({int(r.cfg("input_len")) for r in allruns if C.as_float(r.cfg("input_len"))})
    main_len = lens[-1] if lens else None
    # the serving curves use the longest context; shorter contexts only feed the crossover
    runs = [
        r for r in allruns if main_len is None or C.as_float(r.cfg("input_len")) in (None, main_len)
    ]
    rep = C.Report(
        NAME,
        "Fig. 5 - DeepSeek-V4.1-Flash serving at 500K context (ours: "
        f"{C.curves_and_claims_label(args.results, NAME, 'DeepSeek')})",
    )
    fig, axes = C.subplots(1, 3, width=3.8, height=3.0)
    C.serving_panels(
        axes[0], runs, rep, output_key=OUT, output_label="Output throughput (tok/s/GPU)"
    )
    fig.tight_layout()
    P = PAPER["fig5"]
    tr = C.Tracker(runs)
    cs = sorted({r.concurrency for r in runs if r.concurrency})
    top = 512 if 512 in cs else (cs[-1] if cs else 512)
    note_top = "" if top == 512 else f"our highest C is {top}"
    rep.loads = {c: c for c in cs if c < 512} | ({512: top} if cs else {})
    rep.decode_gpus = DEEPSEEK_DECODE_GPUS  # the paper's DeepSeek deployment: 2 decode GPUs
    o = lambda s, c: tr.val(s, c, OUT)  # noqa: E731
    tt = lambda s, c: tr.val(s, c, "ttft_ms_mean", 1e-3)  # noqa: E731
    tp = lambda s, c: tr.val(s, c, "tpot_ms_mean")  # noqa: E731
    st = lambda a, b, c: C.ratio_stats(C.pick(runs, a, c), C.pick(runs, b, c), OUT)  # noqa: E731

    # the claim from the DeepSeek-like H200 preset's interleaved repeats (fig5_h200) where it
    # has runs, the scaled preset's ratio beside it
    on_h200 = C.h200_ratio_row(
        rep, args.results, NAME, HEADLINE_KEY, "ADHS / Resident + DSpark output",
        P[HEADLINE_KEY], HEADLINE, 512, DEEPSEEK_DECODE_GPUS, OUT,
    )  # fmt: skip
    if on_h200:
        # the step's composition on the same preset: what sets how output follows sessions
        comp = step_composition(args.results, "deepseek")
        if comp:
            rep.diagnose((HEADLINE_KEY,), comp, append=True)
    mini_key, mini_label = (
        (f"{HEADLINE_KEY}_scaled", " (DeepSeek-like scaled preset)")
        if on_h200
        else (HEADLINE_KEY, "")
    )
    rep.compare(
        mini_key,
        f"ADHS / Resident + DSpark output at C512{mini_label}",
        P["adhs_vs_resident_dspark_C512"],
        C.ratio(o("adaptive_dhisparse", top), o("resident_dspark", top)),
        "x",
        tr.take(),
        note_top,
        stats=C.ratio_stats(
            C.pick(runs, "adaptive_dhisparse", top), C.pick(runs, "resident_dspark", top), OUT
        ),
    )
    rep.compare(
        "adhs_output_C512",
        "ADHS output at C512",
        P["adhs_output_C512"],
        o("adaptive_dhisparse", top),
        "tok/s/GPU",
        tr.take(),
        note_top,
    )
    # the latency side of the headline: from fig5_h200 too where it has runs, the scaled
    # preset's beside it
    latency = (
        ("adhs_ttft_lower_C512", "Resident + DSpark TTFT / ADHS TTFT",
         "adhs_ttft_lower_vs_resident_dspark_C512", HEADLINE[::-1], "ttft_ms_mean", tt),
        ("adhs_tpot_higher_C512", "ADHS TPOT / Resident + DSpark TPOT",
         "adhs_tpot_higher_vs_resident_dspark_C512", HEADLINE, "tpot_ms_mean", tp),
    )  # fmt: skip
    for key, what, paper_key, (a, b), value_key, val in latency:
        h200 = C.h200_ratio_row(
            rep, args.results, NAME, key, what, P[paper_key], (a, b), 512,
            DEEPSEEK_DECODE_GPUS, value_key,
        )  # fmt: skip
        rep.compare(
            f"{key}_scaled" if h200 else key,
            f"{what} at C512{mini_label if h200 else ''}",
            P[paper_key],
            C.ratio(val(a, top), val(b, top)),
            "x",
            tr.take(),
            note_top,
        )
    rep.compare(
        "spec_return_C128",
        "ADHS / Adaptive HiSparse output at C128",
        P["spec_return_C128"],
        C.ratio(o("adaptive_dhisparse", 128), o("adaptive_hisparse", 128)),
        "x",
        tr.take(),
        stats=st("adaptive_dhisparse", "adaptive_hisparse", 128),
    )
    rep.compare(
        "spec_return_C512",
        "ADHS / Adaptive HiSparse output at C512",
        P["spec_return_C512"],
        C.ratio(o("adaptive_dhisparse", top), o("adaptive_hisparse", top)),
        "x",
        tr.take(),
        note_top,
        stats=st("adaptive_dhisparse", "adaptive_hisparse", top),
    )
    res = [o("resident", c) for c in cs if c >= 128]
    res = [v for v in res if v is not None]
    rep.compare(
        "resident_plateau",
        "Resident output plateau (mean from C128)",
        P["resident_plateau_tok_s"],
        sum(res) / len(res) if res else None,
        "tok/s/GPU",
        tr.take(),
    )
    rep.compare(
        "resident_ttft_C128",
        "Resident mean TTFT at C128",
        P["resident_ttft_C128_s"],
        tt("resident", 128),
        "s",
        tr.take(),
    )
    rep.compare(
        "resident_ttft_C512",
        "Resident mean TTFT at C512",
        P["resident_ttft_C512_s"],
        tt("resident", top),
        "s",
        tr.take(),
        note_top,
    )
    rep.compare(
        "adaptive_vs_resident_C128",
        "Adaptive HiSparse / Resident output at C128",
        P["adaptive_vs_resident_C128"],
        C.ratio(o("adaptive_hisparse", 128), o("resident", 128)),
        "x",
        tr.take(),
        stats=st("adaptive_hisparse", "resident", 128),
    )
    rep.compare(
        "adaptive_vs_resident_C512",
        "Adaptive HiSparse / Resident output at C512",
        P["adaptive_vs_resident_C512"],
        C.ratio(o("adaptive_hisparse", top), o("resident", top)),
        "x",
        tr.take(),
        note_top,
        stats=st("adaptive_hisparse", "resident", top),
    )
    rep.compare(
        "adaptive_output_C512",
        "Adaptive HiSparse output at C512",
        P["adaptive_output_C512"],
        o("adaptive_hisparse", top),
        "tok/s/GPU",
        tr.take(),
        note_top,
    )
    rep.compare(
        "adaptive_ttft_lower_C512",
        "Resident TTFT / Adaptive HiSparse TTFT at C512",
        P["adaptive_ttft_lower_vs_resident_C512"],
        C.ratio(tt("resident", top), tt("adaptive_hisparse", top)),
        "x",
        tr.take(),
        note_top,
    )
    diffs = [
        abs(C.pct_change(o("adaptive_hisparse", c), o("hisparse", c)) or 0)
        for c in cs
        if c <= 256 and None not in (o("adaptive_hisparse", c), o("hisparse", c))
    ]
    rep.compare(
        "adaptive_vs_hisparse_upto_C256",
        "|Adaptive HiSparse - HiSparse| up to C256 (max)",
        P["adaptive_vs_hisparse_upto_C256_within_pct"],
        max(diffs) if diffs else None,
        "%",
        tr.take(),
    )
    rep.compare(
        "adaptive_vs_hisparse_C512",
        "Adaptive HiSparse above HiSparse at C512",
        P["adaptive_vs_hisparse_C512_pct"],
        C.pct_change(o("adaptive_hisparse", top), o("hisparse", top)),
        "%",
        tr.take(),
        note_top,
    )

    eager = C.eager_note(runs)
    if eager:
        rep.note(eager)
    why = C.diagnosis([r for r in runs if r.concurrency == top], top)
    if why:
        rep.note(why[0].upper() + why[1:] + ".")

    for key, systems in (
        # the scaled runs' breakdown goes with their own row (the claim's, without H200 runs)
        (mini_key, ("adaptive_dhisparse", "resident_dspark")),
        ("spec_return_C512", ("adaptive_dhisparse", "adaptive_hisparse")),
        ("adaptive_vs_resident_C512", ("adaptive_hisparse", "resident")),
    ):
        b = C.claim_breakdown(runs, systems, top)
        if b:
            rep.diagnose((key,), b)

    # context-length crossover at the top concurrency (runs with point.input_len)
    for ctx, pv in P["context_crossover_C512"].items():
        ours = None
        # the paper's contexts as a fraction of its 500K, applied to our longest context
        target = (main_len or 0) * int(ctx) / 500_000
        have = [L for L in lens if target and abs(L - target) / target < 0.5]
        if have:
            L = min(have, key=lambda v: abs(v - target))
            rr = [
                r for r in allruns if C.as_float(r.cfg("input_len")) == L and r.concurrency == top
            ]
            a = C.pick(rr, "adaptive_hisparse")
            b = C.pick(rr, "resident")
            if a and b:
                tr.use([a, b])
                q = C.ratio(a.num(OUT), b.num(OUT))
                ours = None if q is None else ((q - 1) * 100 if pv.unit == "%" else q)
        rep.compare(
            f"crossover_{ctx}",
            f"Adaptive HiSparse vs Resident at {int(ctx):,} tokens, C512",
            pv,
            ours,
            pv.unit,
            tr.take(),
            "at the same fraction of our longest context",
        )
    rep.note(
        "Absolute throughput of a scaled preset on one H200 is not the paper's two-GPU B300 "
        "number; ratios between systems are the comparable quantities."
    )
    return rep.finish(fig, args)


if __name__ == "__main__":
    main()
