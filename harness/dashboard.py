"""The project's W&B workspace and report, defined in code (wandb-workspaces).

    python -m harness.dashboard                       # offline: write the definition, say what it would create
    WANDB_MODE=online python -m harness.dashboard --entity ME   # publish both (make dashboard)

One section per experiment family, each reading the keys ``harness/wandb_logger.py`` logs and
selecting its runs by the ``experiment:<name>`` tags: serving curves over load (Fig. 1 / 4 / 5),
the load step (Fig. 6), the hot-cache budget sweep (Fig. 9, with the Fig. 10 profiles), the
speculation block sweep (Fig. 7, Fig. 11) and the kernels (Fig. 8, whose numbers come from
``benchmarks/bench_resolver.py``, so its section shows the figure ``make figures WANDB=1``
attaches). The workspace holds every run of the project; the report has one panel grid per
family over its tagged runs. Panels name summary keys (``summary/...``), history keys
(``server/...``, ``load/...`` against ``t_s``), config keys (the swept values) and figure
images (``figures/<name>``); tests/harness/test_dashboard.py checks that runs log each of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.environment import REPO
from harness.wandb_logger import LOAD, SERVER, STEP, SUMMARY, figure_key

WORKSPACE_NAME = "Adaptive DHiSparse reproduction"
REPORT_TITLE = "Adaptive DHiSparse: reproduction on the scaled presets"
OFFLINE_ENTITY = "<entity>"  # the definition written offline names no real entity


@dataclass(frozen=True)
class Family:
    """A section: the experiments whose runs it reads, what goes on the x axis (a config key
    for curves over a swept value; ``STEP`` for series over time), and what is plotted."""

    name: str
    experiments: tuple[str, ...]
    figures: tuple[str, ...]
    x: str  # config key (across runs) or STEP (history)
    summary: tuple[str, ...] = ()  # summary keys against x, one scatter each
    history: tuple[tuple[str, ...], ...] = ()  # history keys against t_s, one line plot each
    bars: tuple[str, ...] = ()  # summary keys side by side per run
    note: str = ""

    def tags(self) -> list[str]:
        return [f"experiment:{e}" for e in _with_variants(self.experiments)]


def _with_variants(names: tuple[str, ...]) -> list[str]:
    """The experiments a family's names stand for, as their runs are tagged (the experiment_name
    of conf/experiment/): each with its re-runs under other names (``fig4`` -> ``fig4_h200``,
    ``fig4_h200_sweep``, ``fig4_protocol``, ...; ``fig4_more`` writes as ``fig4``)."""
    from omegaconf import OmegaConf

    from harness.environment import REPO

    out = list(names)
    for p in sorted((REPO / "conf" / "experiment").glob("*.yaml")):
        if any(p.stem.startswith(base + "_") for base in names):
            name = str(OmegaConf.load(p).get("experiment_name") or p.stem)
            if name not in out:
                out.append(name)
    return out


_SERVING = (
    SUMMARY + "output_tok_s_per_gpu",
    SUMMARY + "ttft_ms_median",
    SUMMARY + "tpot_ms_mean",
    SUMMARY + "post_wave_ttft_ms_mean",
)

FAMILIES: tuple[Family, ...] = (
    Family(
        "Serving curves over load (Fig. 1 / 4 / 5)",
        ("fig1", "fig4", "fig5"),
        ("fig1", "fig4", "fig5"),
        x="concurrency",
        summary=_SERVING,
        note="Output tokens/s per GPU, TTFT and TPOT against the closed-loop concurrency, "
        "per system (tag system:<name>).",
    ),
    Family(
        "Load step (Fig. 6)",
        ("fig6",),
        ("fig6",),
        x=STEP,
        history=(
            (SERVER + "dhs_num_running_reqs", SERVER + "dhs_num_waiting_reqs", LOAD + "in_flight"),
            (SERVER + "dhs_kv_pool_used_ratio", SERVER + "dhs_ready_optional_coverage"),
            (LOAD + "completed", LOAD + "errors"),
        ),
        bars=tuple(f"{SUMMARY}phases/{i}/tpot_ms_mean" for i in range(3)),
        note="The paper's C16 -> C256 -> C16 step over time (ours: C12 -> C128 -> C12 on "
        "glm53_mini, C4 -> C64 -> C4 on glm53_h200), residency on and off "
        "(config optional_residency); bars: TPOT per phase.",
    ),
    Family(
        "Hot-cache budget sweep (Fig. 9, Fig. 10)",
        ("fig9", "fig9_dsv", "fig10", "fig10_dsv"),
        ("fig9", "fig10", "table3"),
        x="hot_cache_rows",
        summary=_SERVING[:3],
        note="Serving metrics against B (config hot_cache_rows) at C8 and C128 "
        "(tag load:<point>), both models (tag model:<name>).",
    ),
    Family(
        "Speculation block sweep (Fig. 7, Fig. 11)",
        ("fig7", "fig11", "fig11b"),
        ("fig7", "fig11"),
        x="block_size",
        summary=_SERVING[:3],
        note="Adaptive DHiSparse against the block size K (config block_size) per load.",
    ),
    Family(
        "Kernels (Fig. 8)",
        ("fig8",),
        ("fig8",),
        x=STEP,
        note="Resolver microbenchmarks (benchmarks/bench_resolver.py, not serving runs): the "
        "figure that make figures WANDB=1 attaches.",
    ),
)


def _panels(fam: Family) -> list:
    import wandb_workspaces.reports.v2 as wr

    panels: list = []
    for key in fam.summary:
        panels.append(
            wr.ScatterPlot(
                title=f"{key.removeprefix(SUMMARY)} vs {fam.x}",
                x=wr.Config(fam.x),
                y=wr.SummaryMetric(key),
            )
        )
    for keys in fam.history:
        panels.append(
            wr.LinePlot(
                title=", ".join(k.split("/", 1)[1] for k in keys),
                x=wr.Metric(STEP),
                y=[wr.Metric(k) for k in keys],
            )
        )
    if fam.bars:
        panels.append(
            wr.BarPlot(
                title="per phase", metrics=[wr.SummaryMetric(k) for k in fam.bars], orientation="v"
            )
        )
    if fam.figures:
        panels.append(
            wr.MediaBrowser(
                title="figures (make figures WANDB=1)",
                media_keys=[figure_key(f) for f in fam.figures],
            )
        )
    return panels


def build_workspace(entity: str, project: str):
    import wandb_workspaces.workspaces as ws

    return ws.Workspace(
        entity=entity,
        project=project,
        name=WORKSPACE_NAME,
        sections=[ws.Section(name=f.name, panels=_panels(f), is_open=True) for f in FAMILIES],
        runset_settings=ws.RunsetSettings(groupby=[ws.Config("system.name")]),
    )


def build_report(entity: str, project: str, offline: bool = False):
    """``offline``: the run sets name no entity, so that serializing them asks the W&B server
    nothing (it looks a named project's internal id up)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    blocks: list = [
        wr.P(
            "Each section reads the runs its experiments tagged "
            "(experiment:<name>); harness/dashboard.py defines it."
        )
    ]
    for fam in FAMILIES:
        runset = wr.Runset(
            entity="" if offline else entity,
            project=project,
            name=fam.name,
            filters=expr.And(expr.Tags().isin(fam.tags())),
            groupby=["config.system.name"],
        )
        blocks += [
            wr.H1(fam.name),
            wr.P(fam.note),
            wr.PanelGrid(runsets=[runset], panels=_panels(fam)),
        ]
    return wr.Report(
        entity=entity,
        project=project,
        title=REPORT_TITLE,
        description="Serving curves, the load step, the B and block sweeps and the "
        "kernels of the reproduction, from the runs' W&B logs.",
        blocks=blocks,
    )


@dataclass
class PanelKeys:
    """The keys a definition's panels read, by where a run must have logged them."""

    config: set[str] = field(default_factory=set)
    summary: set[str] = field(default_factory=set)
    history: set[str] = field(default_factory=set)
    media: set[str] = field(default_factory=set)


def panel_keys(families: tuple[Family, ...] = FAMILIES) -> PanelKeys:
    """What the panels of ``_panels`` name, read back from the built panel objects."""
    import wandb_workspaces.reports.v2 as wr

    keys = PanelKeys()

    def add(m) -> None:
        if isinstance(m, wr.Config):
            keys.config.add(m.name)
        elif isinstance(m, wr.SummaryMetric):
            keys.summary.add(m.name)
        elif isinstance(m, wr.Metric):
            keys.history.add(m.name)

    for fam in families:
        for p in _panels(fam):
            if isinstance(p, wr.MediaBrowser):
                keys.media.update(p.media_keys)
                continue
            for attr in ("x", "y", "metrics"):
                v = getattr(p, attr, None)
                for m in v if isinstance(v, list) else [v]:
                    add(m)
    return keys


def definition(entity: str, project: str) -> dict:
    """The workspace and report as the JSON specs wandb-workspaces would save (offline: the
    report's run sets without the project's internal id, which only the server knows)."""
    return {
        "workspace": json.loads(build_workspace(entity, project)._to_model().model_dump_json()),
        "report": json.loads(
            build_report(entity, project, offline=True)._to_model().model_dump_json()
        ),
    }


def describe() -> str:
    lines = [f"workspace {WORKSPACE_NAME!r} and report {REPORT_TITLE!r}, one section each:"]
    for fam in FAMILIES:
        lines.append(
            f"  {fam.name}: {len(_panels(fam))} panels over runs tagged {', '.join(fam.tags())}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--entity",
        default=os.environ.get("WANDB_ENTITY"),
        help="W&B entity (user or team; default WANDB_ENTITY)",
    )
    ap.add_argument("--project", default=os.environ.get("WANDB_PROJECT", "adaptive-dhisparse"))
    ap.add_argument(
        "--out",
        default=str(REPO / "outputs" / "wandb_dashboard.json"),
        help="where the offline definition goes",
    )
    args = ap.parse_args(argv)
    print(describe())
    if os.environ.get("WANDB_MODE") == "online":
        try:
            if not args.entity:
                raise ValueError("no entity: --entity or WANDB_ENTITY")
            wsp = build_workspace(args.entity, args.project).save()
            rep = build_report(args.entity, args.project)
            rep.save()
            print(f"published: workspace {wsp.url}\n           report {rep.url}")
            return 0
        except Exception as e:  # same rule as the logger: say why, keep the definition
            print(
                f"[dashboard] publishing failed ({type(e).__name__}: {e}); writing the "
                "definition offline instead",
                file=sys.stderr,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(definition(args.entity or OFFLINE_ENTITY, args.project), indent=1))
    print(
        f"offline: definition written to {out}; WANDB_MODE=online make dashboard "
        "ARGS='--entity <you>' publishes it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
