"""The figure scripts' one namespace (``from figures import common as C``) over the modules that
do the work, split by job:

- ``harness.results``: loading results/ (Run, load_runs, pick, ...), the counters read from the
  server samples (step_cost, engine_time_split, ...), kernel profiles, and run records;
- ``figures.notes``: provenance and the measured diagnoses written into the reports;
- ``figures.stats``: medians with bootstrap intervals for ratios over repeats;
- ``figures.report``: the paper-vs-ours Report, number formatting, the scripts' command line;
- ``figures.plotting``: colors and the shared panels.

Every figure script has the same shape::

    def main(argv=None) -> Report:
        args = parse_args("fig4", __doc__, argv)          # --results DIR --out DIR --dpi N
        runs = load_runs(args.results, "fig4")            # tolerant: [] when nothing is there
        rep = Report("fig4", "Fig. 4 - ...")
        ... draw panels (not_measured_panel() where there is no data) ...
        rep.compare(key, quantity, paper_value, our_value, unit=..., prov=provenance(runs))
        return rep.finish(fig, args)                      # writes <out>/fig4.png and .md, prints

Scripts read only files under the results directory; nothing here touches a GPU.
"""

from __future__ import annotations

from figures.notes import (  # noqa: F401
    Tracker,
    admission_experiment_note,
    admission_note,
    batch_scaling_note,
    breakdown,
    caveats,
    claim_breakdown,
    compare_ratio,
    curves_and_claims_label,
    diagnosis,
    eager_note,
    h200_ratio_row,
    paired_ratio_note,
    provenance,
    stall_diagnosis,
    summary_provenance,
)
from figures.plotting import (  # noqa: F401
    PALETTE,
    legend,
    mark_unmeasured,
    not_measured_panel,
    panel_title,
    paper_vs_ours_bars,
    plot_system_curve,
    serving_panels,
    subplots,
    system_color,
    system_label,
)
from figures.report import (  # noqa: F401
    DEFAULT_OUT,
    NOT_MEASURED,
    Footnotes,
    Report,
    fmt,
    paper_number,
    paper_source,
    parse_args,
    parse_budget,
    pct_change,
    ratio,
    spread_pct,
)
from figures.stats import (  # noqa: F401
    SPREAD_TARGET,
    argmax_with_ties,
    median_stats,
    ratio_stats,
    repeat_values,
    within_call_spread,
)
from harness.results import (  # noqa: F401
    DEFAULT_RESULTS,
    H200_SUFFIX,
    REPO,
    SUPERSEDED,
    Run,
    accepted_per_round,
    as_float,
    binned,
    binned_share,
    by_system,
    canonical_system,
    change_mix,
    compared_loads,
    copy_grid_of,
    counter_share,
    curve,
    engine_time_split,
    find_key,
    gpu_idle_share,
    graph_replay_share,
    graphs_replayed,
    hot_cache_rows_of,
    load_json,
    load_preferred,
    load_runs,
    load_yaml,
    metric_col,
    output_cap,
    pick,
    pools_sized_for_of,
    preset_label,
    profile_at_load,
    run_value,
    step_cost,
    summary_value,
    timing_split,
    values_by_run_group,
)
