"""W&B logging of serving runs (``logger=wandb``): offline unless ``logger.mode`` or WANDB_MODE
say ``online``.

One W&B run per load point, in the experiment's group, with job type ``serve`` and tags
``system:<name>``, ``model:<name>``, ``experiment:<name>``, ``load:<tag>`` (the paper's load
point), ``commit:<sha>`` and ``gpu:<name>``. While the load runs, each one-second /metrics scrape
is logged as it arrives: the server counters under ``server/<metric>`` and the load generator's
progress under ``load/<sent|completed|errors|in_flight|phase>``, against ``t_s`` (seconds since
the first scrape). When the point ends: the summary under ``summary/<key>``, nested values
flattened with ``/`` (``summary/phases/1/tpot_ms_mean``), and the per-request records as the
table ``requests``. The run's config is the composed Hydra config plus the swept values at the
top level (``concurrency``, ``hot_cache_rows``, ``block_size``, ...; ``harness.run.run_labels``).
``harness/dashboard.py`` builds the workspace and report that read these keys.

W&B never costs a measurement: the summary is on disk before the logger finishes, and any W&B
failure (no API key, no network, a quota) prints one warning per process and falls back to an
offline run (``wandb sync`` uploads it later); if even that fails, the run is not logged.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

JOB_TYPE = "serve"
FIGURES_JOB_TYPE = "figures"
STEP = "t_s"
SERVER = "server/"
LOAD = "load/"
SUMMARY = "summary/"
TABLE = "requests"
FIGURE = "figures/"
# the request table's columns: what one request measured (harness.metrics' definitions)
TABLE_COLUMNS = (
    "index",
    "phase",
    "concurrency",
    "success",
    "status",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "alloc_wait_s",
    "handoff_s",
    "finish_reason",
    "error",
)

_warned: set[str] = set()


def _warn_once(kind: str, text: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        print(f"[harness] W&B: {text}", file=sys.stderr, flush=True)


# ---- the keys a run logs (pure: the dashboard's test derives the logged keys from these) ----


def tags(summary: Mapping[str, Any]) -> list[str]:
    """Run tags from a run's summary (which carries system, model, experiment, point, commit,
    GPU): what the dashboard's sections filter on. W&B caps a tag at 64 characters."""
    pairs = (
        ("system", summary.get("system")),
        ("model", summary.get("model")),
        ("experiment", summary.get("experiment")),
        ("load", (summary.get("point") or {}).get("tag")),
        ("commit", summary.get("git_commit")),
        ("gpu", summary.get("gpu") or "none"),
    )
    return [f"{k}:{v}"[:64] for k, v in pairs if v not in (None, "")]


def run_config(cfg_container: Mapping[str, Any], labels: Mapping[str, Any]) -> dict:
    """The W&B config of a run: the composed config, with the swept values (``run_labels``)
    also at the top level so that a panel can put them on an axis."""
    return {**cfg_container, **labels}


def history_row(sample: Mapping[str, Any], progress: Mapping[str, Any] | None, t0: float) -> dict:
    """One live row: a /metrics scrape and the load generator's progress at that moment."""
    row: dict[str, Any] = {STEP: float(sample["ts"]) - t0}
    row.update({SERVER + k: v for k, v in (sample.get("values") or {}).items()})
    row.update({LOAD + k: v for k, v in (progress or {}).items()})
    return row


def flatten(value: Any, prefix: str = "") -> dict:
    """Nested dicts and lists as ``a/b/0/c`` keys (list items by index: the phases of a load
    step keep their order, so ``phases/1`` is always the high phase). Scalars and strings are
    kept; NaN / inf become None (W&B's summary is JSON)."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}/"))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}{i}/"))
    else:
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[prefix[:-1]] = value
    return out


def summary_row(summary: Mapping[str, Any]) -> dict:
    """The summary's values under ``summary/``. The load generator's own ``config`` echo is left
    out: the run's config holds it."""
    return {
        SUMMARY + k: v
        for k, v in flatten({k: v for k, v in summary.items() if k != "config"}).items()
    }


def request_rows(records: Iterable[Any]) -> list[list]:
    """The request table's rows (``TABLE_COLUMNS``), with the metric definitions of
    harness.metrics."""
    from harness import metrics

    rows = []
    for r in records:
        rec = metrics.as_record(r)
        ms = lambda s: None if s is None else 1000.0 * s  # noqa: E731
        timing = rec.timing or {}
        rows.append(
            [
                rec.index,
                rec.phase,
                rec.concurrency,
                rec.success,
                rec.status,
                rec.prompt_tokens,
                metrics.output_tokens(rec),
                ms(metrics.ttft_s(rec)),
                ms(metrics.tpot_s(rec)),
                ms(metrics.e2e_s(rec)),
                timing.get("alloc_wait_s"),
                timing.get("handoff_s"),
                None if rec.finish_reason is None else str(rec.finish_reason),
                rec.error,
            ]
        )
    return rows


def figure_key(name: str) -> str:
    return FIGURE + name


# ---- the sink ----


class WandbRun:
    """One load point's W&B run. ``sample`` is the load generator's observer (called on its
    event loop once a second); ``finish`` logs the summary and the request table. No method
    raises: a failure warns once and the rest goes to an offline run."""

    def __init__(self, logger: WandbLogger, init_kw: dict):
        self.logger = logger
        self.init_kw = init_kw
        self.run = logger._init(init_kw)
        self.t0: float | None = None
        self.live = self.run is not None  # rows reached the run as they came
        # a live run that failed mid-load: finished after the load, never on the load
        # generator's event loop (an online finish flushes and uploads: seconds of the
        # clients' timestamps)
        self.failed = None

    def sample(self, sample: dict, progress: dict) -> None:
        if self.run is None:
            return
        if self.t0 is None:
            self.t0 = float(sample["ts"])
        try:
            self.run.log(history_row(sample, progress, self.t0))
        except Exception as e:
            _warn_once(
                "log",
                f"live logging failed ({type(e).__name__}: {e}); the rest of "
                "this run goes to an offline run when it ends",
            )
            self.failed, self.run = self.run, None

    def finish(
        self, summary: Mapping[str, Any], records: Iterable[Any], samples: list[dict]
    ) -> None:
        records = list(records)
        self._finish_failed()
        if self.run is None and self.logger.mode != "disabled":
            # the live run failed (or never started): everything goes to an offline run now
            self.logger.fall_back("offline")
            self.run = self.logger._init(self.init_kw)
            self.live = False
        if self.run is None:
            return
        try:
            if not self.live:  # replay the series the live run could not take
                t0 = samples[0]["ts"] if samples else 0.0
                for s in samples:
                    self.run.log(history_row(s, None, t0))
            import wandb

            self.run.log(
                {TABLE: wandb.Table(columns=list(TABLE_COLUMNS), data=request_rows(records))}
            )
            self.run.summary.update(summary_row(summary))
        except Exception as e:
            _warn_once(
                "summary",
                f"logging the summary failed ({type(e).__name__}: {e}); "
                "the run's results on disk are complete",
            )
        finally:
            self._drop()

    def close(self) -> None:
        """End the run without a summary (the load failed: nothing of it is a result)."""
        self._finish_failed()
        self._drop()

    def _finish_failed(self) -> None:
        run, self.failed = self.failed, None
        _finish_quietly(run)

    def _drop(self) -> None:
        run, self.run = self.run, None
        _finish_quietly(run)


def _finish_quietly(run) -> None:
    """Finish a W&B run (None: nothing to do); a failure warns once."""
    if run is not None:
        try:
            run.finish()
        except Exception as e:
            _warn_once("finish", f"finishing the W&B run failed ({type(e).__name__}: {e})")


class WandbLogger:
    def __init__(self, cfg):
        import wandb  # noqa: F401  (ImportError handled by make_logger)

        self.cfg = cfg
        self.mode = str(os.environ.get("WANDB_MODE") or cfg.get("mode") or "offline")
        self.init_timeout_s = float(cfg.get("init_timeout_s") or 60)
        os.environ.setdefault("WANDB_SILENT", "true")

    def fall_back(self, mode: str) -> None:
        """From now on this process logs in ``mode`` (offline, or disabled when offline failed)."""
        self.mode = mode

    def start_run(
        self,
        name: str,
        group: str,
        config: dict,
        summary_tags: list[str],
        run_dir: str,
        job_type: str = JOB_TYPE,
    ) -> WandbRun:
        return WandbRun(
            self,
            dict(
                project=self.cfg.get("project", "adaptive-dhisparse"),
                entity=self.cfg.get("entity"),
                group=group,
                name=name,
                job_type=job_type,
                tags=summary_tags,
                config=config,
                dir=run_dir,
            ),
        )

    def _init(self, kw: dict):
        """``wandb.init`` in this logger's mode; online trouble falls back to offline (once per
        process, with one warning), offline trouble disables the logger."""
        import wandb

        while self.mode != "disabled":
            try:
                Path(kw["dir"]).mkdir(parents=True, exist_ok=True)
                run = wandb.init(
                    mode=self.mode,
                    reinit="create_new",
                    settings=wandb.Settings(init_timeout=self.init_timeout_s, silent=True),
                    **kw,
                )
                if self.mode == "offline":  # say once where the runs are and how to upload
                    _warn_once(
                        "where",
                        f"logging offline into each run's directory ({kw['dir']}/wandb/...); "
                        "upload with: wandb sync <run directory>/wandb/offline-run-*",
                    )
                return run
            except Exception as e:
                if self.mode == "offline":
                    _warn_once(
                        "offline",
                        f"an offline run failed too ({type(e).__name__}: "
                        f"{e}); W&B logging is off for this process",
                    )
                    self.fall_back("disabled")
                else:
                    _warn_once(
                        "online",
                        f"{self.mode} run failed ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); logging "
                        "offline (wandb sync uploads later)",
                    )
                    self.fall_back("offline")
        return None


def make_logger(cfg) -> WandbLogger | None:
    """The configured logger, or None. A missing package is a clear message, not a crash."""
    name = cfg.get("name", "none") if cfg is not None else "none"
    if name in (None, "none"):
        return None
    if name != "wandb":
        raise ValueError(f"logger.name must be none or wandb, got {name!r}")
    try:
        return WandbLogger(cfg)
    except ImportError:
        print(
            "[harness] logger=wandb but wandb is not installed (pip install -e .); "
            "continuing without W&B logging"
        )
        return None


def figure_tags(names: Iterable[str]) -> list[str]:
    """The figures run carries the experiment tag of each figure it holds, so that it sits in
    the dashboard's section of each (harness/dashboard.py filters sections by these tags)."""
    return sorted({f"experiment:{n}" for n in names})


def attach_figures(out_dir: str | Path, cfg=None) -> int:
    """Log each ``<out_dir>/<name>.png`` (``make figures``' output) as the image
    ``figures/<name>`` of one run of job type ``figures``. Returns the number attached."""
    from harness.environment import REPO, environment

    if cfg is None:
        from systems.engine.config import compose

        cfg = compose(["logger=wandb"]).logger
    pngs = sorted(Path(out_dir).glob("*.png"))
    logger = make_logger(cfg)
    if logger is None or not pngs:
        return 0
    env = environment()
    names = [p.stem for p in pngs]
    run_dir = Path(os.environ.get("WANDB_DIR") or REPO / "outputs")  # outputs/ is ignored
    wb = logger.start_run(
        f"figures-{env.get('git_commit') or 'local'}",
        "figures",
        {"figures": names, "git_commit": env.get("git_commit")},
        figure_tags(names) + [f"commit:{env.get('git_commit')}"],
        str(run_dir),
        job_type=FIGURES_JOB_TYPE,
    )
    if wb.run is None:
        return 0
    try:
        import wandb

        wb.run.log({figure_key(p.stem): wandb.Image(str(p)) for p in pngs})
    except Exception as e:
        _warn_once("figures", f"attaching the figures failed ({type(e).__name__}: {e})")
        return 0
    finally:
        wb.close()
    print(
        f"[harness] W&B: {len(pngs)} figures attached ({logger.mode}) to the figures run "
        f"tagged {', '.join(figure_tags(names))}"
    )
    return len(pngs)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Attach make figures' images to W&B.")
    ap.add_argument("--attach-figures", metavar="DIR", default="figures/out")
    attach_figures(ap.parse_args().attach_figures)
