"""Run every paper experiment (conf/experiment/fig*.yaml), resumably.

    python -m harness.reproduce                 # all experiments, on the GPU machine
    python -m harness.reproduce --only fig9     # one
    python -m harness.reproduce --smoke         # every experiment end to end on CPU, tiny sizes
    python -m harness.reproduce --only fig7 model.attention_impl=reference   # + overrides
    python -m harness.reproduce --only fig9 --system hisparse --where b_over_k=4,8 --point c128
    python -m harness.reproduce --status        # what is measured, how stale, a re-run's time

An experiment config lists what it runs under ``reproduce``: ``systems`` (conf/system names) and
``sweep`` (override -> values, crossed; ``b_over_k`` sets system.kv.hot_cache_rows = value * k).
Each combination is one ``harness.run`` over the workload's load points; finished runs are
skipped (results are append-only), so an interrupted reproduction resumes where it stopped;
``--rerun-before TIME`` measures again those measured before TIME (same run ids), to re-measure
after a change that moves the numbers.
``--prune-superseded`` removes the runs a config change left behind (``superseded``).
``--system``, ``--where`` and ``--point`` pick a subset of the plan (the runs with the most weight
first when device time is short) without changing any run's config, so their run ids are the
full sweep's and the rest of the sweep resumes around them later.
``--smoke`` applies the experiment's ``reproduce.smoke`` overrides plus CPU sizes and writes to
a scratch results directory unless ``--results`` is given; ``reproduce.smoke_sweep`` replaces the
sweep there (an experiment that re-runs another's sweep on another preset smokes one setting).

``reproduce.repeats: N`` (3 or more for a claim) makes each sweep combination an interleaved
group: one throwaway warm-up run, then the systems back to back, N times (A B C A B C ...), each
run marked ``+repeat=i`` (its own run id) and all recorded under one ``run_group``, so that the
figures compare systems measured together (docs/running.md, "Loads and repeats"). With
``reproduce.interleave_sweep: true`` the sweep's settings interleave as well (one group).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import itertools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException

from harness.environment import REPO

SMOKE = [
    "hardware=cpu",
    "device=cpu",
    "server.mode=inprocess",
    "workload.input_len=40",
    "workload.output_len=6",
    "workload.num_requests=3",
    "workload.warmup=0",
    "workload.concurrency=[2]",
    "model.max_context_len=512",
    "hardware.kv_pool_gib=0.01",
    "hardware.host_pool_gib=0.05",
    "hardware.max_running_requests=8",
    "workload.prefixes=1",
    "+smoke=true",
]


def experiments() -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / "experiment").glob("fig*.yaml"))


def _value(v) -> str:
    """A Hydra override value: booleans lower-case, strings with commas quoted."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str) and ("," in v or " " in v):
        return f"'{v}'"
    return str(v)


@dataclass
class Group:
    """The runs of one sweep combination of an experiment, in the order they run. Without
    ``reproduce.repeats`` a run per system; with ``reproduce.repeats: N`` the compared systems
    run interleaved, back to back, N rounds (A B C A B C ...), the i-th round's runs marked
    ``+repeat=i`` (a distinct run id each), after one throwaway warm-up run (see ``warm_up``),
    and every run of the group records one ``run_group``."""

    name: str  # the experiment and the sweep values: "fig9 b_over_k=4"
    runs: list[list[str]]  # override lists, one harness.run each
    repeats: int | None = None  # None: one run per system, not interleaved


def groups(exp: str, smoke: bool) -> list[Group]:
    """The experiment's plan, one Group per sweep combination (one per system when an
    experiment without repeats sweeps nothing: the order the plan always had, system-major).
    ``reproduce.interleave_sweep: true`` (with repeats) makes the whole sweep one group whose
    rounds run every combination back to back, for claims that compare the sweep's settings
    (residency on / off, block sizes) rather than systems."""
    from systems.engine.config import compose

    base = compose([f"experiment={exp}"])
    rep = base.get("reproduce") or {}
    systems = list(rep.get("systems") or [base.system.name])
    sweep = (
        rep.get("smoke_sweep") if smoke and rep.get("smoke_sweep") is not None else rep.get("sweep")
    )
    sweep = OmegaConf.to_container(sweep, resolve=True) if sweep is not None else {}
    repeats = rep.get("repeats")
    if repeats is not None and int(repeats) < 1:
        raise ValueError(f"{exp}: reproduce.repeats must be an integer >= 1, got {repeats}")
    extra = []
    if smoke:
        extra = list(SMOKE) + [f"{k}={_value(v)}" for k, v in (rep.get("smoke") or {}).items()]
    keys = list(sweep)
    combos = []
    for values in itertools.product(*[sweep[k] for k in keys]) if keys else [()]:
        sets = []
        for k, v in zip(keys, values):
            sets.append(f"+b_over_k={v}" if k == "b_over_k" else f"{k}={_value(v)}")
        combos.append(sets)

    # per-system overrides (``reproduce.system_overrides: {system: {key: value}}``), before the
    # smoke's so that a smoke run stays small: e.g. more requests for the systems whose claim
    # needs a steady state than for one that serves a wave a few requests at a time
    per_system = rep.get("system_overrides")
    per_system = OmegaConf.to_container(per_system, resolve=True) if per_system else {}
    unknown = set(per_system) - set(systems)
    if unknown:
        raise ValueError(
            f"{exp}: reproduce.system_overrides names systems the experiment does not run: "
            f"{sorted(unknown)} (reproduce.systems: {systems})"
        )

    def runs(system: str, sets: list[str], repeat: int | None = None) -> list[str]:
        mark = [f"+repeat={repeat}"] if repeat is not None else []
        own = [f"{k}={_value(v)}" for k, v in (per_system.get(system) or {}).items()]
        return [f"experiment={exp}", f"system={system}"] + own + extra + sets + mark

    def name(sets: list[str]) -> str:
        return " ".join([exp] + [s.lstrip("+") for s in sets])

    if repeats is None:
        if rep.get("interleave_sweep"):
            raise ValueError(f"{exp}: reproduce.interleave_sweep needs reproduce.repeats")
        return [Group(name(sets), [runs(system, sets)]) for system in systems for sets in combos]
    if rep.get("interleave_sweep"):  # the sweep's settings are what a claim compares
        return [
            Group(
                f"{exp} (sweep interleaved)",
                [
                    runs(s, sets, i)
                    for i in range(1, int(repeats) + 1)
                    for sets in combos
                    for s in systems
                ],
                int(repeats),
            )
        ]
    return [
        Group(
            name(sets),
            [runs(s, sets, i) for i in range(1, int(repeats) + 1) for s in systems],
            int(repeats),
        )
        for sets in combos
    ]


def plan(exp: str, smoke: bool) -> list[list[str]]:
    """Override lists, one per harness.run invocation, in the order they run."""
    return [ov for g in groups(exp, smoke) for ov in g.runs]


def setting(ov: list[str], key: str) -> str | None:
    """The value an override list gives ``key`` (``+key`` alike), or None."""
    for o in ov:
        k, _, v = o.partition("=")
        if k.lstrip("+") == key:
            return v
    return None


def select(
    runs: list[list[str]], systems: list[str] | None, where: list[str] | None
) -> list[list[str]]:
    """The plan's runs whose ``system=`` is in ``systems`` and whose sweep values match every
    ``key=v1,v2`` of ``where`` (a key the run does not set never matches)."""
    conds = []
    for w in where or []:
        if "=" not in w:
            raise ValueError(f"--where wants key=value[,value...], got {w!r}")
        k, vs = w.split("=", 1)
        conds.append((k.lstrip("+"), {v.strip() for v in vs.split(",")}))

    return [
        ov
        for ov in runs
        if (not systems or setting(ov, "system") in systems)
        and all(setting(ov, k) in vs for k, vs in conds)
    ]


def _run_cfg(overrides: list[str], results: str | None):
    from omegaconf import open_dict

    from systems.engine.config import compose

    if results:
        overrides = overrides + [f"results_dir={results}"]
    cfg = compose(overrides)
    if cfg.get("b_over_k"):
        if "hot_cache_rows" not in (cfg.system.get("kv") or {}):
            raise ValueError(
                f"b_over_k: system {cfg.system.name!r} has no hot cache (system.kv.hot_cache_rows)"
            )
        cfg.system.kv.hot_cache_rows = int(cfg.b_over_k) * int(cfg.model.index_topk)
    if cfg.system.get("speculation") and "+smoke=true" in overrides:
        # a smoke run's pool holds a small drafter: a short window and the default width,
        # whatever drafter the experiment sizes for its preset (reproduce.speculation.draft_dim)
        cfg.system.speculation.window = 64
        cfg.system.speculation.draft_dim = 64
    rep = cfg.get("reproduce")
    for key in ("skip_points", "smoke_sweep", "warm_up_concurrency"):
        if rep is not None and key in rep:
            # read by the plan and dropped here: which points it leaves out or smokes is no part
            # of what a run measures (its config.yaml, its id, the figures' repeat folding)
            with open_dict(cfg):
                del cfg.reproduce[key]
    return cfg


@functools.cache
def _reproduce_block(exp: str):
    """The experiment's ``reproduce`` block as its config composes it (empty without one)."""
    from systems.engine.config import compose

    return compose([f"experiment={exp}"]).get("reproduce") or {}


@functools.cache
def _skip_entries(exp: str) -> tuple:
    entries = _reproduce_block(exp).get("skip_points")
    return tuple(OmegaConf.to_container(entries, resolve=True)) if entries is not None else ()


def skipped_points(overrides: list[str]) -> list[str]:
    """The load points the experiment's ``reproduce.skip_points`` leaves out of this run of its
    plan: entries ``{point: c8, <sweep key>: value, ...}`` whose sweep values all match the
    run's (points no figure reads)."""
    exp = next(o.split("=", 1)[1] for o in overrides if o.startswith("experiment="))
    out = []
    for entry in _skip_entries(exp):
        entry = dict(entry)
        tag = str(entry.pop("point"))
        if select([overrides], None, [f"{k}={_value(v)}" for k, v in entry.items()]):
            out.append(tag)
    return out


def run_one(
    overrides: list[str],
    results: str | None,
    only_tags: list[str] | None = None,
    run_group: str | None = None,
) -> None:
    from harness.run import run

    run(_run_cfg(overrides, results), only_tags=only_tags, reproduce_keys=True, run_group=run_group)


# The warm-up's load where the group's first point is an open-loop rate
WARM_UP_CONCURRENCY = 8
# a warm-up request's output at most: what warms (compiled kernels, weights and prefixes cached on
# disk, the driver) is warm after a few hundred steps, and fig1_h200's 4,000-token outputs would
# otherwise make the throwaway wave as long as a measured run
WARM_UP_OUTPUT_TOKENS = 1024


def warm_up_point(overrides: list[str], only_tags: list[str] | None) -> tuple[str, int]:
    """(the tag of the point the warm-up stands in for, the concurrency it runs at). A load step
    warms up at its peak, so that the kernels of the batch sizes the peak meets compile there
    and not in the first measured run. An experiment's ``reproduce.warm_up_concurrency`` caps
    it (no part of a run's config or id): where a wave at the load is minutes of handoffs
    (fig5_h200's C256 of 125K-token prompts) and its batch sizes' CUDA graphs are captured at
    the server's start-up anyway."""
    from harness.run import _load_points, point_concurrency

    points = _load_points(_run_cfg(overrides, None))
    p = next((p for p in points if only_tags is None or p["tag"] in only_tags), points[0])
    c = point_concurrency(p) or WARM_UP_CONCURRENCY
    exp = setting(overrides, "experiment")
    cap = _reproduce_block(exp).get("warm_up_concurrency") if exp else None
    return p["tag"], min(c, int(cap)) if cap else c


def warm_up(overrides: list[str], only_tags: list[str] | None, results: str | None = None) -> None:
    """One throwaway run before an interleaved group, so that its first measured run is warm:
    a fresh machine's first serving run measured up to 2x slower than the same run after it,
    also with Triton's cache carried in (results/cold_cache/). The group's first run, at its
    first load point, one wave of requests (closed loop) of at most ``WARM_UP_OUTPUT_TOKENS``
    output tokens, into a scratch results directory that is removed afterwards: no figure can
    read it. Its server logs are kept beside the experiment's (``.server-*/warm-up-*.log``
    under ``results``, or the config's results directory): on a fresh machine the warm-up's
    server start-up is where drawing the weights and compiling kernels shows."""
    from omegaconf import open_dict

    from harness.run import run

    _, c = warm_up_point(overrides, only_tags)
    scratch = tempfile.mkdtemp(prefix="dhs-warm-up-")
    try:
        cfg = _run_cfg(overrides, scratch)
        with open_dict(cfg):
            for key, value in {
                "schedule": None,
                "request_rate": None,
                "paper_concurrency": None,
                "concurrency": [c],
                "num_requests": c,
                "min_waves": 1,
                "output_len": min(cfg.workload.output_len, WARM_UP_OUTPUT_TOKENS),
            }.items():
                cfg.workload[key] = value
        run(cfg, reproduce_keys=True)
    finally:
        keep = Path(_run_cfg(overrides, results).results_dir)
        for log in Path(scratch).glob("*/.server-*/*.log"):
            dest = keep / log.relative_to(scratch).parent / f"warm-up-{log.name}"
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, dest)
            except OSError as e:  # a log is worth less than the runs after it
                print(f"[reproduce] warm-up log {log} not kept: {e}", flush=True)
        shutil.rmtree(scratch, ignore_errors=True)


def warm_mark(overrides: list[str], tag: str) -> Path | None:
    """Where this machine records that a system's warm-up ran for these overrides (the repeat
    marker aside) and warm-up point: a file under DHS_WARM_DIR (benchmarks/gpu_batch.sh sets a
    machine-local one), or None without it. What a first run pays for is the machine's (Triton
    kernels compiled for the experiment's shapes, the weights and prefixes in the page cache):
    a later item of the same batch, or a call on the same held machine, that runs the same
    configuration again finds it warm."""
    root = os.environ.get("DHS_WARM_DIR")
    if not root:
        return None
    same = sorted(o for o in overrides if setting([o], "repeat") is None)
    key = hashlib.sha1(json.dumps([same, tag]).encode()).hexdigest()[:16]
    return Path(root) / f"{setting(overrides, 'system')}-{key}"


def begin_interleaved(
    g: Group,
    runs: list[list[str]],
    group: str,
    results: str | None,
    point: list[str] | None,
    dry_run: bool,
) -> None:
    """Say what an interleaved group runs, then (unless a dry run, or when every point of
    ``runs`` finished earlier) make its throwaway warm-up runs, one per system: a system's first
    serving run on a machine measures slow, whatever ran before it (docs/running.md)."""
    todo = [(ov, tags) for ov in runs if (tags := _points_to_run(ov, point)) != []]
    if not todo:
        return
    firsts: dict[str, tuple[list[str], list[str] | None]] = {}
    for ov, tags in todo:
        firsts.setdefault(setting(ov, "system"), (ov, tags))
    tag, c = warm_up_point(*todo[0])
    print(
        f"[reproduce] interleaved group {g.name!r}: {len({setting(o, 'repeat') for o in runs})} "
        f"repeat(s) of {len({setting(o, 'system') for o in runs})} system(s), back to back, run "
        f"group {group}; first a throwaway warm-up run per system ({', '.join(firsts)} for "
        f"{tag}: one wave at C{c}, not kept)",
        flush=True,
    )
    if dry_run or not any(has_pending(ov, results, t, skipped_points(ov)) for ov, t in todo):
        return
    for system, first in firsts.items():
        mark = warm_mark(first[0], tag)
        if mark is not None and mark.exists():
            print(
                f"[reproduce] {system}: no warm-up, this machine already warmed it up for this "
                f"configuration ({mark})",
                flush=True,
            )
            continue
        try:
            warm_up(*first, results=results)
        except Exception as e:  # the measured runs still run, and say so if they fail
            print(
                f"[reproduce] warm-up of {system} FAILED: {e!r}; its first run is cold",
                flush=True,
            )
            continue
        if mark is not None:
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()


def session_name() -> str:
    """What this reproduce call's run groups start with: DHS_RUN_GROUP (benchmarks/gpu_batch.sh
    sets one per batch), else the time and host."""
    return os.environ.get("DHS_RUN_GROUP") or (
        f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{socket.gethostname()}"
    )


def _duration_guide(exp_dir: Path, prefix: str, cfg) -> str:
    """The load time of the latest finished run of the same system, model and point, preferring
    one with the same output cap (a run's time scales with it)."""
    from omegaconf import OmegaConf

    cap = cfg.workload.get("output_len")
    best = None
    for d in sorted(exp_dir.glob(prefix + "*"), key=lambda d: d.stat().st_mtime, reverse=True):
        try:
            dur = json.loads((d / "summary.json").read_text()).get("duration_s")
            other = OmegaConf.load(d / "config.yaml").workload.get("output_len")
        except Exception:  # unfinished or unreadable: no guide from it
            continue
        if dur and (best is None or (other == cap and best[2] != cap)):
            best = (dur, d.name, other)
        if best and best[2] == cap:
            break
    if best is None:
        return ""
    note = "" if best[2] == cap else f", at a {best[2]}-token cap against {cap} now"
    return f" (a finished run of this point took {best[0]:.0f} s{note}: {best[1]})"


def show_plan(
    overrides: list[str],
    results: str | None,
    only_tags: list[str] | None = None,
    skip: list[str] = (),
) -> tuple[int, int]:
    """--dry-run: each load point's run id, whether it finished, and for a pending one the
    wall time of the latest finished run of the same system and point in that experiment
    (any config: a guide for a time box, which adds a server start of 10-25 s on the H200).
    Returns the numbers of finished and pending points (``skip``ped ones are neither)."""
    from harness.run import legacy_run_id, point_plan

    cfg = _run_cfg(overrides, results)
    exp_dir, plan = point_plan(cfg, only_tags)
    done = pending = 0
    for p, rid, finished in plan:
        if "paper_concurrency" in p:  # harness.run mapped the paper's C to ours
            rid = f"{rid} (paper C{p['paper_concurrency']})"
        if p["tag"] in skip:
            print(
                f"    {p['tag']:>6s} {rid}: not in the plan (reproduce.skip_points: no figure "
                f"reads it){', finished earlier' if finished else ''}"
            )
            continue
        if finished:
            done += 1
            print(f"    {p['tag']:>6s} {rid}: finished")
            continue
        pending += 1
        prefix = legacy_run_id(cfg, p).rsplit("-", 1)[0] + "-"  # system-model-tag-: any setting
        print(f"    {p['tag']:>6s} {rid}: pending{_duration_guide(exp_dir, prefix, cfg)}")
    return done, pending


def _planned(
    overrides: list[str], results: str | None, only_tags: list[str] | None, skip
) -> list[tuple[str, bool]]:
    """(run id, finished) of each load point of a run of the plan, the ``skip``ped ones left
    out."""
    from harness.run import point_plan

    _, points = point_plan(_run_cfg(overrides, results), only_tags)
    return [(rid, bool(done)) for p, rid, done in points if p["tag"] not in skip]


def _plan_points(exp: str, results: str | None) -> list[tuple[str, bool]]:
    """(run id, finished) of every load point of ``exp``'s plan, the skipped ones left out."""
    return [
        x for ov in plan(exp, smoke=False) for x in _planned(ov, results, None, skipped_points(ov))
    ]


def plan_status(exp: str, results: str | None = None, points=None) -> tuple[int, int]:
    """(finished, pending) runs of ``exp``'s plan in ``results`` (points the plan skips are
    neither): what REPRODUCTION.md says of an experiment whose config changed after its runs.
    ``points``: its ``_plan_points`` where the caller has them."""
    points = _plan_points(exp, results) if points is None else points
    done = sum(d for _, d in points)
    return done, len(points) - done


def off_plan_runs(exp: str, results: str | None = None, points=None) -> list[str]:
    """Finished runs in ``exp``'s results directory that no plan writing there names: runs of
    a config changed since (their points are pending under new ids) or of a removed setting.
    The figures still read them until they are re-run or pruned (--prune-superseded).
    ``points``: ``exp``'s own plan points where the caller has them."""
    from harness.results import finished_runs

    target = exp_dir_name(exp)
    planned = {rid for rid, _ in (_plan_points(exp, results) if points is None else points)}
    for name in experiments():
        if name != exp and exp_dir_name(name) == target:
            planned |= {rid for rid, _ in _plan_points(name, results)}
    runs = finished_runs(results or REPO / "results", target)
    return sorted(r.path.name for r in runs if r.path.name not in planned)


def superseded(exp: str, results: str | None = None) -> list[Path]:
    """Committed runs in ``exp``'s directory that a finished run of its plan replaces: the same
    name up to the config hash (system, model, load, budget, repeat), a run id no experiment
    writing to that directory plans. What a config change leaves behind (a new default that joins
    the id, e.g. the HiSparse baseline's fixed copy grid): the figures would read both until the
    old runs are removed. A run whose name no planned run shares is never listed, nor a repeat
    of a planned config (a ``+rerun`` run: the figures fold it into the planned run's median),
    nor a run measured after the planned run that would replace it (a later re-measurement
    under an extra override, which the figures read instead of the older planned run)."""
    from harness.results import Run, _repeat_key, load_json
    from harness.run import point_plan

    target = exp_dir_name(exp)
    exp_dir, planned, replaced_by = None, set(), {}
    for name in experiments():
        if exp_dir_name(name) != target:
            continue
        for ov in plan(name, smoke=False):
            exp_dir, points = point_plan(_run_cfg(ov, results))
            for _, rid, done in points:
                planned.add(rid)
                if done:
                    replaced_by[rid.rsplit("-", 1)[0]] = rid
    if exp_dir is None or not exp_dir.is_dir():
        return []

    def run(d: Path) -> Run:
        return Run(d, load_json(d / "summary.json") or {})

    def measured(r: Run) -> str:
        return str(r.env.get("time_utc") or "")

    replacing = {name: run(exp_dir / rid) for name, rid in replaced_by.items()}
    repeated = {_repeat_key(r) for r in replacing.values()}
    old = []
    for d in exp_dir.iterdir():
        name = d.name.rsplit("-", 1)[0]
        if (d / "summary.json").exists() and d.name not in planned and name in replacing:
            r = run(d)
            if measured(r) < measured(replacing[name]) and _repeat_key(r) not in repeated:
                old.append(d)
    return sorted(old)


# a server start on the H200 (10-25 s) plus its share of a group's warm-up: what a run costs on top
# of its load, for --status's estimate of a re-run
RUN_OVERHEAD_S = 30.0


def status_row(exp: str, results: str | None = None) -> dict:
    """What --status says of one experiment: its plan's finished and pending runs, the commits
    its committed runs were measured at, how many later changes that move the numbers
    (harness.results.MEASUREMENT_CHANGES) the oldest of them predates, when the newest was
    measured, and the device minutes a whole re-run would take (the committed runs' load time
    plus RUN_OVERHEAD_S each)."""
    from harness.results import MEASUREMENT_CHANGES, _after_change, load_runs, moved_commits

    points = _plan_points(exp, results)
    done, pending = plan_status(exp, results, points)
    off_plan = len(off_plan_runs(exp, results, points))
    singles = [
        x for r in load_runs(results or "results", exp_dir_name(exp)) for x in (r.repeats or [r])
    ]
    commits = sorted({x.commit for x in singles if x.commit})
    before = [
        change
        for change, _ in MEASUREMENT_CHANGES
        if any(_after_change(c, change) is False for c in moved_commits(change, singles))
    ]
    load_s = sum(float(x.summary.get("duration_s") or 0.0) for x in singles)
    return {
        "experiment": exp,
        "done": done,
        "pending": pending,
        "off_plan": off_plan,
        "runs": len(singles),
        "commits": commits,
        "changes_since": len(before),
        "newest_change_since": before[-1] if before else None,
        "measured": max((str(x.env.get("time_utc") or "") for x in singles), default="")[:10],
        "rerun_min": (load_s + RUN_OVERHEAD_S * len(singles)) / 60.0,
    }


def print_status(names: list[str], results: str | None) -> None:
    """--status: one line per experiment (see status_row)."""
    print(
        f"{'experiment':24s} {'plan done/pending':>17s} {'off plan':>8s} {'runs':>5s} "
        f"{'changes since':>13s} {'measured':>10s} {'re-run':>8s}  commits"
    )
    # each row composes its experiment's whole plan (~0.15 s a config, 200 of them): the rows
    # are worked out in processes of their own, printed in order
    workers = min(len(names), os.cpu_count() or 1)
    if workers > 1:
        with concurrent.futures.ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(status_row, names, [results] * len(names)))
    else:
        rows = [status_row(exp, results) for exp in names]
    for exp, r in zip(names, rows):
        since = f"{r['changes_since']}" + (
            f" ({r['newest_change_since']})" if r["newest_change_since"] else ""
        )
        print(
            f"{exp:24s} {r['done']:>8d}/{r['pending']:<8d} {r['off_plan']:>8d} {r['runs']:>5d} "
            f"{since:>13s} "
            f"{r['measured'] or '-':>10s} {r['rerun_min']:>5.1f} min  {', '.join(r['commits'])}"
        )
    print(
        "off plan: finished runs in the experiment's directory under ids no plan writing there "
        "names (a config changed since: their points are pending under new ids; the figures read "
        "them until re-run or pruned); "
        "changes since: later commits of harness.results.MEASUREMENT_CHANGES that the oldest "
        "committed run predates, of those that move its KV backend (CHANGE_SCOPE; the newest in "
        "brackets); re-measure under the same run ids with "
        "--rerun-before <UTC time> (gpu_batch.sh: EXP+rerun-before=...); re-run: the committed "
        f"runs' load time plus {RUN_OVERHEAD_S:.0f} s each",
        flush=True,
    )


@functools.cache
def exp_dir_name(exp: str) -> str:
    """The results directory an experiment writes to: the experiment_name its config file sets
    (every file under conf/experiment/ sets its own; composed where one would not)."""
    path = REPO / "conf" / "experiment" / f"{exp}.yaml"
    name = OmegaConf.load(path).get("experiment_name") if path.exists() else None
    return str(name or _run_cfg([f"experiment={exp}"], None).experiment_name)


def has_pending(
    overrides: list[str], results: str | None, only_tags: list[str] | None, skip: list[str] = ()
) -> bool:
    """Whether a run of the plan has a load point left to measure."""
    return not all(done for _, done in _planned(overrides, results, only_tags, skip))


def _points_to_run(overrides: list[str], point: list[str] | None) -> list[str] | None:
    """--point's tags less the skipped ones; None: every point; []: none."""
    skip = skipped_points(overrides)
    if not skip:
        return point
    from harness.run import _load_points

    tags = point or [p["tag"] for p in _load_points(_run_cfg(overrides, None))]
    return [t for t in tags if t not in skip]


def calls(overrides: list[str], tags: list[str] | None) -> list[list[str] | None]:
    """The harness calls that run one entry of the plan (``tags``: its points, None for all):
    one per load point where the run has a profile, whose collectors run for the server's whole
    life and leave their outputs in the call's first run (docs/profiling.md), so that each
    point's profile is its own; else one call for every point."""
    from harness.run import _load_points, profiled

    cfg = _run_cfg(overrides, None)
    if not profiled(cfg):
        return [tags]

    every = [p["tag"] for p in _load_points(cfg)]
    chosen = [t for t in every if tags is None or t in tags]
    return [[t] for t in chosen] if len(chosen) > 1 else [tags]


NO_GPU = (
    "[reproduce] harness.reproduce needs a CUDA GPU (one H200-class GPU, 80+ GB; up to 64 "
    "GiB of pinned host memory; README: GPU prerequisites) and torch sees none here. "
    "make reproduce DRY=1 lists the plan; python -m harness.reproduce --smoke runs it "
    "small on CPU."
)


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def h200_sized(plans: dict[str, list]) -> list[str]:
    """The experiments whose presets are sized for an NVIDIA H200 (``*_h200``: their pools and
    batch fill its 141 GB). On an 80 GB H100 the DeepSeek-like preset does not fit, and the
    GLM-like one fits but times another GPU's steps into figures whose other runs are the
    H200's (a GPU machine asked for an H200 may be lent an H100)."""
    return sorted(
        exp
        for exp, chosen in plans.items()
        if any(
            str(_run_cfg(runs[0], None).model.name).endswith("_h200") for _, runs in chosen if runs
        )
    )


def _choices(exp_groups: list[Group]) -> str:
    """What --system and --where can pick in an experiment's plan."""
    runs = [ov for g in exp_groups for ov in g.runs]
    fixed = {"experiment", "system", "smoke"}
    values: dict[str, set[str]] = {}
    for ov in runs:
        for o in ov:
            k, _, v = o.partition("=")
            if k.lstrip("+") not in fixed:
                values.setdefault(k.lstrip("+"), set()).add(v)

    def order(v: str):  # numbers by value (2 before 16), then the rest by name
        try:
            return (0, float(v), v)
        except ValueError:
            return (1, 0.0, v)

    swept = {k: sorted(v, key=order) for k, v in values.items() if len(v) > 1}
    systems = sorted({setting(ov, "system") for ov in runs})
    return f"systems {systems}" + "".join(
        f"; {k}: {', '.join(v)}" for k, v in sorted(swept.items())
    )


def chosen_groups(exp: str, args) -> list[tuple[Group, list[list[str]]]]:
    """The groups of ``exp``'s plan with the runs --system / --where pick, each run's overrides
    followed by the command line's; a ValueError naming what can be chosen when they pick
    nothing, when an override is a key nothing reads, or when --point names no load point."""
    from harness.run import _load_points, check_keys

    exp_groups = groups(exp, args.smoke)
    chosen = [(g, select(g.runs, args.system, args.where)) for g in exp_groups]
    chosen = [(g, [ov + list(args.overrides) for ov in runs]) for g, runs in chosen if runs]
    if not chosen:
        n = sum(len(g.runs) for g in exp_groups)
        raise ValueError(
            f"--system / --where select none of its {n} runs; it has {_choices(exp_groups)}"
        )
    # the command line's overrides are every run's: one composed run finds a key nothing reads
    check_keys(_run_cfg(chosen[0][1][0], None), reproduce_keys=True)
    if args.point:
        tags = {p["tag"] for _, runs in chosen for p in _load_points(_run_cfg(runs[0], None))}
        unknown = sorted(set(args.point) - tags)
        if unknown:
            raise ValueError(f"--point {unknown}: its load points are {sorted(tags)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    from harness.servers import exit_on_sigterm

    exit_on_sigterm()  # a time box's SIGTERM stops the running server too
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", action="append", help="experiment name (repeatable), e.g. fig9")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny CPU run of every combination (of reproduce.smoke_sweep where set)",
    )
    ap.add_argument(
        "--results",
        default=None,
        help="results directory (default results/; with --smoke a scratch directory)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    ap.add_argument("--system", action="append", help="only these systems (repeatable)")
    ap.add_argument(
        "--where",
        action="append",
        help="only sweep combinations with key=v1,v2 (repeatable), e.g. b_over_k=4,8",
    )
    ap.add_argument(
        "--point", action="append", help="only these load points, by tag (repeatable), e.g. c128"
    )
    ap.add_argument(
        "--rerun-before",
        metavar="UTC_TIME",
        help="measure again the finished runs measured before this time, e.g. 20261203T103000Z "
        "(after a change that moves the numbers; run ids stay; the old directories are moved "
        "to <run-id>.superseded-<time>)",
    )
    ap.add_argument(
        "--prune-superseded",
        action="store_true",
        help="remove the runs of each experiment that a finished run of its plan replaces (same "
        "name up to the config hash, an id no plan has: a config change's old runs); with "
        "--dry-run only list them; no GPU needed",
    )
    ap.add_argument(
        "--status",
        action="store_true",
        help="per experiment: planned runs finished and pending, the commits of its committed "
        "runs and the later changes that move the numbers they predate, and a re-run's device "
        "time; no GPU needed",
    )
    ap.add_argument(
        "--any-gpu",
        action="store_true",
        help="run experiments of the H200 presets (*_h200) on another GPU too (their runs "
        "record the GPU; the figures would mix its timings with the H200's)",
    )
    ap.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides appended to every run, e.g. model.attention_impl=reference",
    )
    args = ap.parse_args(argv)
    if args.rerun_before:  # read where a run is judged finished (harness.run.point_plan)
        from harness.run import parse_utc

        try:
            parse_utc(args.rerun_before)
        except ValueError:
            ap.error(
                f"--rerun-before: a UTC time such as 20261203T103000Z, got {args.rerun_before!r}"
            )
        os.environ["DHS_RERUN_BEFORE"] = args.rerun_before
    names = [n for o in args.only or [] for n in o.split(",") if n] or experiments()
    unknown = sorted(set(names) - set(experiments()))
    if unknown:
        ap.error(f"unknown experiment(s) {unknown}; available: {experiments()}")
    if args.status:
        print_status(names, args.results)
        return 0
    if args.prune_superseded:
        for exp in names:
            old = superseded(exp, args.results)
            if not old:
                print(f"[reproduce] {exp}: nothing superseded", flush=True)
            for d in old:
                print(
                    f"[reproduce] {exp}: {d.name} superseded"
                    + (" (dry run: kept)" if args.dry_run else ": removed"),
                    flush=True,
                )
                if not args.dry_run:
                    shutil.rmtree(d)
        return 0
    if not (args.dry_run or args.smoke) and not has_gpu():
        print(NO_GPU, flush=True)
        return 2
    results = args.results
    if args.smoke and results is None:
        results = str(Path("/tmp") / f"dhs-smoke-{int(time.time())}")
    failed = []
    totals: dict[str, list[int]] = {}
    session = session_name()
    plans = {}
    for exp in names:  # every selection and override checked before anything runs
        try:
            plans[exp] = chosen_groups(exp, args)
        except (ValueError, HydraException, OmegaConfBaseException) as e:
            ap.error(f"{exp}: {e}")
    if not (args.dry_run or args.smoke or args.any_gpu):
        wrong = h200_sized(plans)
        if wrong and "H200" not in (gpu := gpu_name()):
            print(
                f"[reproduce] {', '.join(wrong)}: presets sized for an NVIDIA H200, and this GPU "
                f"is {gpu}; their figures compare runs on the H200 (--any-gpu runs them anyway)",
                flush=True,
            )
            return 2
    for exp, chosen in plans.items():
        for g, runs in chosen:
            group = None
            if g.repeats:
                group = f"{session}/{g.name.replace(' ', '/')}"
                begin_interleaved(g, runs, group, results, args.point, args.dry_run)
            for ov in runs:
                tags = _points_to_run(ov, args.point)
                print(
                    "[reproduce]",
                    " ".join(ov),
                    *(["points", *tags] if tags is not None else []),
                    flush=True,
                )
                if args.dry_run:
                    counts = show_plan(ov, results, args.point, skipped_points(ov))
                    totals[exp] = [a + b for a, b in zip(totals.get(exp, [0, 0]), counts)]
                    continue
                if tags == []:
                    print("    every point of this run is left out (reproduce.skip_points)")
                    continue
                for call in calls(ov, tags):
                    try:
                        run_one(ov, results, call, run_group=group)
                    except Exception as e:  # keep going: one failed run must not lose the others
                        print(f"[reproduce] FAILED: {e!r}", flush=True)
                        failed.append((exp, ov, repr(e)))
    if args.dry_run:
        print("\n[reproduce] the plan per experiment (load points):")
        width = max([16, *map(len, totals)])
        for exp, (done, pending) in totals.items():
            print(f"  {exp:<{width}s} {done:>4d} done {pending:>4d} pending")
    else:
        from harness.summaries import write_all

        write_all(Path(results) if results else REPO / "results")
    if failed:
        print(f"[reproduce] {len(failed)} run(s) failed:")
        for exp, ov, e in failed:
            print(f"  {exp}: {' '.join(ov)}\n    {e}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        from harness.run import INTERRUPTED

        print(f"[reproduce] {INTERRUPTED}", file=sys.stderr, flush=True)
        sys.exit(130)
