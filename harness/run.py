"""Hydra entry point: compose conf/, serve the system, run the load, store the results.

    python -m harness.run experiment=default_cpu
    python -m harness.run -m system=resident model=tiny workload.concurrency=[1,8]

One run = one (config, load point). Results go to ``results/<experiment>/<run-id>/``:
``config.yaml``, ``records.jsonl`` (one line per request, appended as it completes),
``server_metrics.parquet`` (one-second /metrics samples), ``summary.json`` (written atomically,
last: its presence marks the run finished), ``env.json``. Run ids are derived from the config, so
an interrupted sweep resumes by skipping finished runs; a run directory without summary.json is
an unfinished attempt and is moved aside to ``<run-id>.failed-<time>`` before the rerun (a finished
run measured again under DHS_RERUN_BEFORE, to ``<run-id>.superseded-<time>``, and back in place if
the new measurement fails).

A run that fails (the load raised, was interrupted, or the server was not healthy once the load
ended) keeps its ``records.jsonl`` and gets ``error.txt`` (what failed, the traceback, the tail of
the server log) instead of ``summary.json``, so a resumed sweep redoes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.environment import REPO, environment
from harness.load_mapping import decode_gpus, ours_concurrency
from harness.records import atomic_write_json
from harness.results import REPRODUCE_UNHASHED, drop_implicit_defaults, load_json
from harness.servers import bundled_server, on_sigterm
from harness.sglang_launch import sglang_server
from harness.wandb_logger import make_logger, run_config, tags


def _ints(v) -> list[int]:
    return [int(c) for c in (v if OmegaConf.is_list(v) or isinstance(v, list) else [v])]


def _load_points(cfg: DictConfig) -> list[dict]:
    """The workload's load points. A closed-loop workload written in the paper's concurrency
    (``workload.paper_concurrency``) is mapped to ours here and nowhere else
    (harness/load_mapping.py: paper C runs as C/4 on one H200, C/2 for the DeepSeek-like presets);
    each point then carries both, and
    the paper's C is hashed into its run id, so it is recorded in summary.json's point."""
    w = cfg.workload
    if w.get("schedule"):
        return [{"schedule": str(w.schedule), "tag": "step"}]
    if w.get("request_rate") is not None:
        return [{"request_rate": float(w.request_rate), "tag": f"r{w.request_rate}"}]
    if w.get("paper_concurrency") is not None:
        paper = _ints(w.paper_concurrency)
        gpus = decode_gpus(cfg.model.get("name"))
        ours = [ours_concurrency(c, gpus) for c in paper]  # a clear error for a C that cannot map
        if w.get("concurrency") is not None and _ints(w.concurrency) != ours:
            raise ValueError(
                f"workload.paper_concurrency {paper} runs as ours {ours} on one H200, but "
                f"workload.concurrency says {_ints(w.concurrency)}: set workload.concurrency to "
                "null (or workload.paper_concurrency to null to give our loads directly)"
            )
        return [
            {"concurrency": o, "paper_concurrency": p, "tag": f"c{o}"} for p, o in zip(paper, ours)
        ]
    conc = _ints(w.concurrency)
    if not conc or min(conc) < 1:
        raise ValueError(f"workload.concurrency must list integers >= 1, got {conc}")
    return [{"concurrency": c, "tag": f"c{c}"} for c in conc]


def point_concurrency(point: dict) -> int | None:
    """The most requests a load point keeps in flight: a closed loop's concurrency, a load
    step's peak; None for an open-loop rate."""
    if point.get("schedule"):
        from harness.loadgen import parse_schedule

        return max(c for c, _ in parse_schedule(point["schedule"]))
    return int(point["concurrency"]) if point.get("concurrency") else None


def num_requests(w: DictConfig, concurrency: int | None) -> int:
    """Requests of a closed-loop point: ``workload.num_requests``, but at least
    ``workload.min_waves`` (default 1) x C, so that post-wave metrics (which skip the first C
    requests) have data at the highest loads."""
    n, waves = int(w.num_requests), int(w.get("min_waves") or 1)
    if n < 1 or waves < 1:
        raise ValueError(
            f"workload.num_requests and workload.min_waves must be >= 1, got {n} and {waves}"
        )
    return max(n, waves * (concurrency or 0))


def run_labels(cfg: DictConfig, point: dict) -> dict:
    """The values an experiment sweeps, as they label a run: its load point, the hot-cache budget
    B of a hierarchy backend, the speculation block size K, and residency when it is off. They
    name the run directory and tag its W&B run, so that a sweep's directories say what each
    measured without opening ``config.yaml``."""
    labels = {"load": point["tag"]}
    b = hot_cache_rows(cfg)
    if b is not None:
        labels["hot_cache_rows"] = b
    spec = cfg.system.get("speculation")
    if spec and spec.get("block_size") is not None:
        labels["block_size"] = int(spec.block_size)
    kv = cfg.system.get("kv") or {}
    if kv.get("optional_residency") is False:
        labels["optional_residency"] = False
    if cfg.get("repeat") is not None:  # harness.reproduce's interleaved repeats
        labels["repeat"] = int(cfg.repeat)
    return labels


def wandb_labels(cfg: DictConfig, point: dict) -> dict:
    """The values a W&B run's config carries at its top level, for panels across runs: the
    swept values (``run_labels``) and the point's concurrency (ours, and the paper's where the
    experiment is written in it)."""
    loads = {k: point[k] for k in ("concurrency", "paper_concurrency") if point.get(k) is not None}
    return {**run_labels(cfg, point), **loads}


def hot_cache_rows(cfg: DictConfig) -> int | None:
    """The resolved hot-cache budget B of the system's backend (0 -> 2k there), None for a
    backend without a hot cache."""
    from systems.engine.config import kv_options_from, model_config_from, resolve_device

    device = resolve_device(cfg.get("device", "auto"), check=False)  # ids need no GPU
    options = kv_options_from(cfg.system, model_config_from(cfg.model, device), device)
    b = getattr(options, "hot_cache_rows", None)
    return None if b is None else int(b)


# The layout every committed run was hashed in, before B moved from model.hot_cache_rows to
# system.kv.hot_cache_rows and the backends' implicit defaults were written into conf/system/:
# run ids hash the config in that layout, so that the runs measured before keep their ids (and
# a resumed sweep skips them). The models' B then, which resident runs carried unread:
_MODEL_B_BEFORE = {"glm53_mini": 1024, "dsv41_mini": 2048, "tiny": 16, "tiny_dsv": 16}


def _hashed_layout(cfg: DictConfig, material: dict) -> dict:
    kv = (material.get("system") or {}).get("kv")
    model = material["model"]
    if isinstance(kv, dict) and "hot_cache_rows" in kv:
        del kv["hot_cache_rows"]
        model["hot_cache_rows"] = hot_cache_rows(cfg)
        if kv.get("pools_sized_for_rows") == model["hot_cache_rows"]:
            del kv["pools_sized_for_rows"]  # pools sized for B itself: the default's run
    elif model.get("name") in _MODEL_B_BEFORE:
        model["hot_cache_rows"] = _MODEL_B_BEFORE[model["name"]]
    drop_implicit_defaults(material)
    return material


_LABEL_PARTS = {
    "hot_cache_rows": "B{}",
    "block_size": "K{}",
    "optional_residency": lambda v: "resoff",
    "repeat": "rep{}",
}


def _config_hash(cfg: DictConfig, point: dict) -> str:
    material = _hashed_layout(cfg, OmegaConf.to_container(cfg, resolve=True))
    for volatile in ("server", "logger", "results_dir", "hydra"):
        material.pop(volatile, None)
    for key in REPRODUCE_UNHASHED:
        (material.get("reproduce") or {}).pop(key, None)
    material["point"] = point
    return hashlib.sha1(json.dumps(material, sort_keys=True).encode()).hexdigest()[:8]


def run_id(cfg: DictConfig, point: dict) -> str:
    """Stable id: what was measured and the swept values (``run_labels``), plus a hash of
    everything that could change the result, e.g. ``hisparse-glm53_mini-c32-B2048-1a2b3c4d``."""
    engine = "sglang-" if cfg.server.mode == "sglang" else ""  # never mistaken for a bundled run
    parts = [f"{engine}{cfg.system.name}", str(cfg.model.name), point["tag"]]
    for key, value in run_labels(cfg, point).items():
        fmt = _LABEL_PARTS.get(key)
        if fmt is not None:
            parts.append(fmt(value) if callable(fmt) else fmt.format(value))
    return "-".join(parts + [_config_hash(cfg, point)])


def legacy_run_id(cfg: DictConfig, point: dict) -> str:
    """The id runs had before the swept values joined it (same hash): committed results keep
    those directory names, and a sweep resumes around them."""
    engine = "sglang-" if cfg.server.mode == "sglang" else ""
    return f"{engine}{cfg.system.name}-{cfg.model.name}-{point['tag']}-{_config_hash(cfg, point)}"


# Keys a config may carry beyond conf/config.yaml's own: an experiment's ``reproduce`` block, the
# markers ``+rerun=<tag>`` / ``+repeat=<i>`` (harness.reproduce's interleaved repeats) /
# ``+smoke=true`` / ``+prewarm=1`` (benchmarks/gpu_batch.sh's throwaway run), and the collectors'
# folder the server launcher sets. Optional workload keys: ``min_waves``, ``paper_concurrency``,
# ``warmup_output_len`` (the warm-up requests' output cap; absent: output_len).
_EXTRA_TOP_KEYS = {"reproduce", "rerun", "repeat", "smoke", "prewarm", "profile_dir"}
_EXTRA_WORKLOAD_KEYS = {"min_waves", "paper_concurrency", "warmup_output_len"}
# Sweep keys that only harness.reproduce understands (it turns them into config values).
REPRODUCE_KEYS = {"b_over_k": "system.kv.hot_cache_rows=<B> (B = b_over_k x model.index_topk)"}


def name_backend(cfg: DictConfig) -> None:
    """A system run on another KV backend (``system=resident system.kv_backend=mine``, a quick
    try of a new backend) is named ``resident+mine``: its run ids, tables, summaries and W&B
    tags would otherwise file it under the system's own backend, and the figures would plot it
    as that system."""
    from systems.engine.config import CONF_DIR, compose

    system = cfg.system
    if not (CONF_DIR / "system" / f"{system.name}.yaml").is_file():
        return  # a system of no conf/system file (or named here already): nothing to compare
    own = compose([f"system={system.name}"]).system.kv_backend
    if str(system.kv_backend) != str(own):
        with open_dict(cfg):
            system.name = f"{system.name}+{system.kv_backend}"


def check_keys(cfg: DictConfig, reproduce_keys: bool = False) -> None:
    """Unknown keys are errors, not silently ignored settings: a ``+key=...`` Hydra accepted at
    the top level or under ``workload`` that nothing reads, or a harness.reproduce sweep key
    (``+b_over_k``) given to harness.run."""
    from systems.engine.config import check_known_keys

    for key in cfg:
        if key in REPRODUCE_KEYS and not reproduce_keys:
            raise ValueError(
                f"{key} is a sweep key of harness.reproduce (e.g. python -m "
                f"harness.reproduce --only fig9 --where {key}=4); with "
                f"harness.run set {REPRODUCE_KEYS[key]}"
            )
    extra = _EXTRA_TOP_KEYS | (set(REPRODUCE_KEYS) if reproduce_keys else set())
    check_known_keys(cfg, extra, _EXTRA_WORKLOAD_KEYS)


def _write_metrics(samples: list[dict], path: Path) -> None:
    import pandas as pd

    rows = [{"ts": s["ts"], **s.get("values", {})} for s in samples]
    df = pd.DataFrame(rows)
    tmp = path.with_suffix(".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)


class ServerFailed(RuntimeError):
    """The server was not healthy when a run's load ended: the run's numbers are not kept."""


class RunFailed(RuntimeError):
    """Every request of a run failed: nothing was measured, so no summary is written and a
    resumed sweep redoes the run."""


class ConfigError(ValueError):
    """A config this harness cannot run (an unknown key, a value out of range, a device this
    machine lacks), found before any server starts; the command line says it in one line."""


def _server_failure(url: str) -> str | None:
    """Why the server a run measured is unhealthy after the load, or None if it is healthy."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return None if r.status == 200 else f"GET /health answered {r.status}"
    except urllib.error.HTTPError as e:
        return f"GET /health answered {e.code}: {e.read()[:500].decode('utf-8', 'replace')}"
    except Exception as e:
        return f"server unreachable after the run: {type(e).__name__}: {e}"


def _restore_superseded(d: Path, superseded: Path | None) -> None:
    """After a re-measurement of ``d`` failed (or was cut): its attempt goes aside as
    ``.failed-<time>`` and the earlier measurement, moved to ``superseded``, comes back."""
    if superseded is None or not superseded.exists() or (d / "summary.json").exists():
        return
    if d.exists():
        d.rename(d.with_name(f"{d.name}.failed-{int(time.time())}"))
    superseded.rename(d)


def _prepare(cfg, ecfg, p: dict, d: Path, url: str, env: dict):
    """A point's run directory with its config and env; the load generator's config."""
    d.mkdir(parents=True)
    OmegaConf.save(cfg, d / "config.yaml", resolve=True)
    atomic_write_json(d / "env.json", {**env, "device": ecfg.device})
    return _load_config(cfg, ecfg, p, url, d)


def _start_logging(logger, cfg, p: dict, rid: str, d: Path, env: dict):
    """The point's W&B run (None without a logger)."""
    if logger is None:
        return None
    return logger.start_run(
        rid,
        str(cfg.logger.get("group") or cfg.experiment_name),
        run_config(OmegaConf.to_container(cfg, resolve=True), wandb_labels(cfg, p)),
        tags(
            {
                "system": cfg.system.name,
                "model": cfg.model.name,
                "experiment": cfg.experiment_name,
                "point": p,
                "git_commit": env["git_commit"],
                "gpu": env["gpu"],
            }
        ),
        str(d),
    )


def _measure(cfg, ecfg, p: dict, rid: str, d: Path, url: str, env: dict, lcfg, wb):
    """The load of one point (logged live to ``wb`` where given), then the server samples and,
    last, summary.json, which marks the run finished. Returns (summary, load result)."""
    from harness.loadgen import run_load_sync  # (aiohttp and the loop only where a load runs)

    res = run_load_sync(lcfg, observer=wb.sample if wb is not None else None)
    failure = _server_failure(url)
    if failure is not None:
        raise ServerFailed(
            f"{rid}: the server failed during the run ({failure}); "
            f"{len(res.records)} records kept, no summary written"
        )
    errors = int(res.summary.get("errors") or 0)
    if errors and not res.summary.get("completed"):
        raise RunFailed(
            f"{rid}: all {errors} requests failed, first: {_first_error(res.records)}"
            "; records kept, no summary written"
        )
    if errors:
        print(
            f"[harness] {rid}: WARNING {errors} of {len(res.records)} requests "
            f"failed (first: {_first_error(res.records)}); records.jsonl has each",
            flush=True,
        )
    if res.samples:
        _write_metrics(res.samples, d / "server_metrics.parquet")
    summary = {
        **res.summary,
        "run_id": rid,
        "system": cfg.system.name,
        "model": cfg.model.name,
        "experiment": cfg.experiment_name,
        "point": p,
        "device": ecfg.device,
        "gpu": env["gpu"],
        "git_commit": env["git_commit"],
    }
    if profiled(cfg):  # the collectors' outputs come when the server stops (_collect_profile)
        summary["profile_pending"] = True
    atomic_write_json(d / "summary.json", summary)  # marks the run finished
    return summary, res


def profiled(cfg) -> bool:
    """Whether collectors run inside this run's server (profile=kernels, host, ...)."""
    return str((cfg.get("profile") or {}).get("name") or "none") != "none"


def _write_error(d: Path, exc: BaseException, server_dir: Path) -> None:
    """error.txt: a clear first line, the traceback, and the tail of each server log there is
    (the bundled server's, or an SGLang deployment's per role)."""
    what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
    text = f"run failed: {what}\n\n" + "".join(traceback.format_exception(exc))
    from harness.servers import server_log

    logs = [server_log(server_dir), *sorted(server_dir.glob("sglang-*.log"))]
    for log in (p for p in logs if p.exists()):
        text += f"\n--- tail of {log} ---\n" + log.read_text(errors="replace")[-5000:]
    tmp = d / ".error.txt.tmp"
    tmp.write_text(text)
    tmp.replace(d / "error.txt")


def point_plan(
    cfg: DictConfig, only_tags: list[str] | None = None
) -> tuple[Path, list[tuple[dict, str, bool]]]:
    """The experiment directory and, per load point of ``cfg`` (those tagged ``only_tags``
    when given), the point, its run id and whether that run finished earlier."""
    root = Path(cfg.results_dir)
    if not root.is_absolute():
        root = REPO / root
    exp_dir = root / cfg.experiment_name
    points = _load_points(cfg)
    if only_tags:
        unknown = sorted(set(only_tags) - {p["tag"] for p in points})
        if unknown:
            raise ValueError(
                f"no load point tagged {unknown} in this config; its points are "
                f"{[p['tag'] for p in points]}"
            )
        points = [p for p in points if p["tag"] in only_tags]
    out = []
    for p in points:
        rid = run_id(cfg, p)
        old = legacy_run_id(cfg, p)
        if (
            not (exp_dir / rid / "summary.json").exists()
            and (exp_dir / old / "summary.json").exists()
        ):
            rid = old  # finished under the id it had before the swept values joined it
        finished = _finished(exp_dir / rid) and not _stale(exp_dir / rid)
        out.append((p, rid, finished))
    return exp_dir, out


def parse_utc(text: str):
    """A UTC time as env.json records it (2026-12-03T10:30:00Z) or as run groups name it
    (20261203T103000Z)."""
    from datetime import UTC, datetime

    t = text.strip()
    try:
        return datetime.strptime(t, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        d = datetime.fromisoformat(t.replace("Z", "+00:00"))
        return d if d.tzinfo else d.replace(tzinfo=UTC)


def _finished(run_dir: Path) -> bool:
    """A summary, and no profile still to come: a profiled run's summary says
    ``profile_pending`` until the server's collectors' outputs have been moved in (they are
    written when the server stops, after the load), so a run cut in between is measured again
    rather than kept without its profile."""
    s = load_json(run_dir / "summary.json")
    return isinstance(s, dict) and not s.get("profile_pending")


def _stale(run_dir: Path) -> bool:
    """With DHS_RERUN_BEFORE=<UTC time> (``harness.reproduce --rerun-before``), a finished run
    measured before that time counts as not finished: an experiment is re-measured after a
    change that moves its numbers under the same run ids, and a call cut short resumes with
    the runs it already redid, whatever was committed in between."""
    cutoff = os.environ.get("DHS_RERUN_BEFORE")
    if not cutoff:
        return False
    measured = (load_json(run_dir / "env.json") or {}).get("time_utc")
    return measured is None or parse_utc(measured) < parse_utc(cutoff)


def run(
    cfg: DictConfig,
    only_tags: list[str] | None = None,
    reproduce_keys: bool = False,
    run_group: str | None = None,
    title: str | None = None,
) -> list[Path]:
    """Run every load point of ``cfg`` not finished earlier. ``only_tags`` (e.g. ["c128"])
    restricts this call to those points without touching the config, so the run ids stay
    those of the full sweep and a later full call resumes around them. ``reproduce_keys``:
    harness.reproduce's sweep keys are allowed (it has applied them). ``run_group`` names the
    runs measured together (env.json; default DHS_RUN_GROUP)."""
    from systems.engine.config import resolve_engine_config

    try:  # fail fast on a bad config, before any server starts
        check_keys(cfg, reproduce_keys)
        name_backend(cfg)
        # a bundled server runs on this machine's device; an SGLang deployment on its own
        ecfg = resolve_engine_config(cfg, check_device=cfg.server.mode != "sglang")
        if cfg.server.mode == "sglang":
            from systems.sglang.adapter import check_supported

            check_supported(cfg)
        exp_dir, plan = point_plan(cfg, only_tags)
        for p, rid, _ in plan:
            try:
                _load_config(cfg, ecfg, p, "http://127.0.0.1", exp_dir / rid).check()
            except ValueError as e:  # LoadConfig's fields are the workload's keys
                raise ValueError(f"workload.{e}") from e
    except ValueError as e:
        raise ConfigError(str(e)) from e
    todo = []
    for p, rid, finished in plan:
        d = exp_dir / rid
        if finished:
            print(f"[harness] {rid}: finished earlier, skipping")
            continue
        todo.append((p, rid, d))
    done_dirs = [exp_dir / rid for _, rid, _ in plan]
    if not todo:
        return done_dirs
    logger = make_logger(cfg.get("logger"))
    warn_profile_in_warmup(cfg)
    warn_profile_skipped(cfg)
    env = environment()
    if run_group:
        env["run_group"] = run_group
    exp_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    server_dir = exp_dir / f".server-{cfg.system.name}-{cfg.model.name}"
    serve = sglang_server if cfg.server.mode == "sglang" else bundled_server
    with serve(cfg, server_dir) as server:
        url = server if isinstance(server, str) else None
        if url is None:
            url = f"http://{cfg.server.host}:{cfg.server.port}"
        for p, rid, d in todo:
            superseded = None
            if (d / "summary.json").exists():  # a stale run measured again (DHS_RERUN_BEFORE)
                superseded = d.with_name(f"{rid}.superseded-{int(time.time())}")
                d.rename(superseded)
            elif d.exists():  # an unfinished attempt
                d.rename(d.with_name(f"{rid}.failed-{int(time.time())}"))
            # the earlier measurement stands until one replaces it: put back after any failure,
            # Ctrl-C, or a time box's SIGTERM (whose handler exits without unwinding)
            restore = functools.partial(_restore_superseded, d, superseded)
            with on_sigterm(restore):
                wb = None
                try:
                    lcfg = _prepare(cfg, ecfg, p, d, url, env)
                    wb = _start_logging(logger, cfg, p, rid, d, env)
                    summary, res = _measure(cfg, ecfg, p, rid, d, url, env, lcfg, wb)
                except BaseException as e:  # incl. KeyboardInterrupt: say why there is no summary
                    try:
                        if wb is not None:
                            wb.close()
                        if d.is_dir():  # (its preparation may have failed before it existed)
                            _write_error(d, e, server_dir)
                    finally:
                        restore()
                    raise
            if wb is not None:  # after the summary is on disk: W&B never costs a measurement
                wb.finish(summary, res.records, res.samples)
            rows.append({**summary, "_dir": str(d)})
            print(
                f"[harness] {rid}: done -> {d.relative_to(REPO) if d.is_relative_to(REPO) else d}"
            )
    _collect_profile(server_dir, [Path(r["_dir"]) for r in rows if r.get("_dir")])
    _print_table(rows, title)
    return done_dirs


def _load_config(cfg: DictConfig, ecfg, p: dict, url: str, d: Path):
    """The load generator's config for load point ``p`` of ``cfg``, writing into ``d``."""
    from harness.loadgen import LoadConfig

    w = cfg.workload
    conc = p.get("concurrency")
    return LoadConfig(
        url=url,
        api=str(w.api),
        concurrency=conc,
        request_rate=p.get("request_rate"),
        schedule=p.get("schedule"),
        num_requests=num_requests(w, conc) if not p.get("schedule") else None,
        input_len=int(w.input_len),
        output_len=int(w.output_len),
        prefixes=int(w.prefixes) if w.get("prefixes") else None,
        vocab_size=int(w.get("vocab_size") or ecfg.model.vocab_size),
        warmup=int(w.warmup),
        warmup_output_len=(
            int(w.warmup_output_len) if w.get("warmup_output_len") is not None else None
        ),
        out=str(d / "records.jsonl"),
        metrics_out=str(d / "server_metrics.jsonl"),
        seed=int(cfg.seed),
        num_gpus=int(cfg.hardware.get("num_gpus", 1)),
        temperature=float(w.get("temperature", 0.0)),
        ignore_eos=True,
        quiet=True,
    )


def _first_error(records) -> str:
    for r in records:
        if not r.success:
            return f"{r.error} (HTTP {r.status})" if r.status else str(r.error)
    return "none"


def warn_profile_in_warmup(cfg) -> bool:
    """A kernel or host profile's window counts engine steps from the server's start, so with
    warm-up requests its first ``profile.wait`` steps may be theirs (batch 1): say so before the
    run (the figures leave such profiles out). True when it warned."""
    prof = cfg.get("profile") or {}
    name = str(prof.get("name", "none"))
    if name not in ("kernels", "host"):
        return False
    from harness.loadgen import warmup_request_count

    w = cfg.workload
    warm = warmup_request_count(w.get("warmup"), w.get("prefixes"))
    # the warm-up runs before the first load point, at up to its concurrency (a schedule's peak)
    conc = point_concurrency(_load_points(cfg)[0]) or 1
    cap = w.get("warmup_output_len")
    steps = -(-warm // conc) * int((w.get("output_len") if cap is None else cap) or 0)
    wait = int(prof.get("wait") or 0)
    if warm and wait <= steps:
        print(
            f"[harness] warning: profile={name} starts after {wait} engine steps, but the {warm} warm-up "
            f"request(s) take about {steps} steps first: the profile will be of the warm-up, not of "
            f"the load. Set workload.warmup=0 or profile.wait above {steps}.",
            flush=True,
        )
        return True
    return False


def warn_profile_skipped(cfg) -> str | None:
    """``profile=nsight`` is skipped inside the server when nsight-python, ``ncu`` or a GPU is
    missing; say so on this console too, where the user is looking (the server's own message
    goes to its log). Returns the reason, or None when the collector can run."""
    prof = cfg.get("profile") or {}
    if str(prof.get("name", "none")) != "nsight" or cfg.server.mode == "sglang":
        return None
    from profiling.nsight import nsight_available

    ok, why = nsight_available()
    if ok:
        return None
    print(
        f"[harness] profile=nsight will be skipped: {why}; the runs go ahead without it", flush=True
    )
    return why


def _collect_profile(server_dir: Path, run_dirs: list[Path]) -> None:
    """Collectors run inside the server's engine for its whole life; their outputs (written when
    the server stops) go to the first run of this server, where the figure scripts read them."""
    import shutil

    from harness.servers import server_profile_dir

    prof = server_profile_dir(server_dir)
    if prof.is_dir() and run_dirs:
        for sub in prof.iterdir():
            dest = run_dirs[0] / sub.name
            if not dest.exists():
                shutil.move(str(sub), str(dest))
        shutil.rmtree(prof, ignore_errors=True)  # what a rerun's outputs would otherwise sit beside
    for d in run_dirs:  # finished now: whatever the collectors wrote is in place
        s = load_json(d / "summary.json")
        if isinstance(s, dict) and s.pop("profile_pending", None) is not None:
            atomic_write_json(d / "summary.json", s)


def _fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def _print_table(rows: list[dict], title: str | None = None) -> None:
    if not rows:
        return
    hdr = (
        f"{'system':<20} {'C':>5} {'done':>5} {'err':>4} {'out tok/s':>10} "
        f"{'TTFT ms':>9} {'TPOT ms':>9} {'ITL ms':>8}"
    )
    print("\n" + (f"{title}\n" if title else "") + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        c = r["point"].get("concurrency", r["point"].get("tag"))
        print(
            f"{r['system']:<20} {c!s:>5} {r.get('completed', 0):>5} {r.get('errors', 0):>4} "
            f"{_fmt(r.get('output_tok_s')):>10} {_fmt(r.get('ttft_ms_mean')):>9} "
            f"{_fmt(r.get('tpot_ms_mean'), 2):>9} {_fmt(r.get('itl_ms_mean'), 2):>8}"
        )


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from harness.servers import exit_on_sigterm

    exit_on_sigterm()
    title = None
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:  # one table per job: say which job's it is
        title = f"job {hc.job.num}: {' '.join(hc.overrides.task)}"
    try:
        run(cfg, title=title)
    except ConfigError as e:  # the user's to fix: one line, no traceback, a usage error's code
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"[harness] {INTERRUPTED}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


INTERRUPTED = (
    "interrupted: finished runs are kept; the unfinished one keeps its records.jsonl and "
    "error.txt, and running the same command again resumes there"
)


if __name__ == "__main__":
    main()
