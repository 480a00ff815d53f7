"""Optional W&B logging (``logger=wandb``); offline unless WANDB_MODE / logger.mode say otherwise.

Keys: the run's config under ``config``; summary scalars under ``summary/<key>``; the one-second
server counters as a time series with ``t_s`` (seconds since the run started) as the step metric,
under ``server/<metric>``. Runs of one experiment share a group, so a workspace can plot
``summary/output_tok_s_per_gpu`` against ``config.concurrency`` per ``config.system``.
"""

from __future__ import annotations

import os
from typing import Any


class WandbLogger:
    def __init__(self, cfg):
        import wandb  # noqa: F401  (ImportError handled by make_logger)
        self.cfg = cfg
        os.environ.setdefault("WANDB_MODE", str(cfg.get("mode") or "offline"))
        os.environ.setdefault("WANDB_SILENT", "true")

    def log_run(self, name: str, group: str, config: dict, summary: dict,
                samples: list[dict], run_dir: str) -> None:
        import wandb
        run = wandb.init(project=self.cfg.get("project", "adaptive-dhisparse"),
                         entity=self.cfg.get("entity"), group=group, name=name,
                         config=config, dir=run_dir, reinit=True)
        try:
            run.define_metric("t_s")
            run.define_metric("server/*", step_metric="t_s")
            t0 = samples[0]["ts"] if samples else 0.0
            for s in samples:
                row = {"t_s": s["ts"] - t0}
                row.update({f"server/{k}": v for k, v in s.get("values", {}).items()})
                run.log(row)
            run.summary.update({f"summary/{k}": v for k, v in summary.items()
                                if isinstance(v, (int, float)) and v is not None})
        finally:
            run.finish()


def make_logger(cfg) -> Any | None:
    """The configured logger, or None. A missing optional extra is a clear message, not a crash."""
    name = cfg.get("name", "none") if cfg is not None else "none"
    if name in (None, "none"):
        return None
    if name != "wandb":
        raise ValueError(f"logger.name must be none or wandb, got {name!r}")
    try:
        return WandbLogger(cfg)
    except ImportError:
        print("[harness] logger=wandb but wandb is not installed "
              "(pip install '.[wandb]'); continuing without W&B logging")
        return None
