"""Start or attach to an SGLang deployment for one run, and stop what was started.

The runner's hook (harness/servers.py, ``server.mode == "sglang"``)::

    from harness.sglang_launch import sglang_server
    with sglang_server(cfg, workdir) as url:
        ...  # the same load generator, against url

``server.sglang.launch``:
- ``subprocess``: the processes of the adapter's plan (one server, or prefill + decode + router
  under PD) from ``server.sglang.command`` / ``router_command``, each in its own session with
  its log in ``workdir/sglang-<role>.log``; each must answer ``GET /health`` before the next
  starts; on exit each process group gets SIGTERM, then SIGKILL.
- ``attach``: ``server.url`` (and ``server.sglang.attach_health_urls``) must answer
  ``GET /health``; nothing is started or stopped.

The config is checked (``adapter.build_plan``) before anything starts: a system without an
SGLang equivalent raises ``ValueError`` here.

Stand-alone, with the same Hydra overrides as the runner::

    python -m harness.sglang_launch --dry-run server=sglang system=hisparse model=glm53_mini \\
        server.sglang.model_path=/models/GLM-5.3-FP8      # print the commands
    python -m harness.sglang_launch server=sglang ...      # start them, serve until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.servers import free_port, stop_process, track, wait_healthy  # noqa: F401 (re-exported)
from systems.sglang.adapter import LaunchPlan, _plain, build_plan, settings

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"


def _resolve_command(argv: list[str]) -> list[str]:
    """A relative program path (e.g. .venv-sglang/bin/python) is taken from the repo root."""
    if argv and os.sep in argv[0] and not os.path.isabs(argv[0]):
        candidate = REPO / argv[0]
        if candidate.exists():
            return [str(candidate), *argv[1:]]
    return list(argv)


@contextlib.contextmanager
def launch_plan(
    plan: LaunchPlan, workdir: Path, timeout_s: float, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Start the plan's processes in order, wait for each, yield the load URL, stop them."""
    workdir.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ, PYTHONUNBUFFERED="1", **plan.env, **(env or {}))
    started: list[subprocess.Popen] = []
    try:
        steps = [(s.role, [*plan.command, *s.args], s.url, s.gpus) for s in plan.servers]
        if plan.router_args is not None:
            steps.append(("router", [*plan.router_command, *plan.router_args], plan.url, None))
        for role, argv, url, gpus in steps:
            argv = _resolve_command(argv)
            log_path = workdir / f"sglang-{role}.log"
            penv = dict(base_env)
            if gpus:
                penv["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            with open(log_path, "ab") as log:
                log.write(f"$ {' '.join(argv)}\n".encode())
                log.flush()
                proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=penv,
                    cwd=str(REPO),
                    start_new_session=True,
                )
            started.append(proc)
            track(proc, group=True)
            print(f"[sglang] {role}: pid {proc.pid}, log {log_path}", flush=True)
            wait_healthy(url, timeout_s, proc, log_path, f"SGLang {role}")
        yield plan.url
    finally:
        for proc in reversed(started):  # router first, then decode, then prefill
            stop_process(proc, group=True)  # SGLang forks schedulers


@contextlib.contextmanager
def sglang_server(cfg: Any, workdir: Path | str) -> Iterator[str]:
    """Yield the base URL of an SGLang deployment configured by ``cfg`` (see module doc)."""
    workdir = Path(workdir)
    root = _plain(cfg)
    srv = root.get("server") or {}
    s = settings(cfg)
    timeout = float(srv.get("startup_timeout_s") or 1800)
    launch = s.get("launch")
    if launch == "attach":
        if not srv.get("url"):
            raise ValueError(
                "server.url is required with server.sglang.launch=attach (the router URL under PD)"
            )
        from systems.sglang.adapter import check_supported

        check_supported(cfg)  # the same systems are refused whether we start SGLang or not
        url = str(srv["url"]).rstrip("/")
        for u in [*(s.get("attach_health_urls") or []), url]:
            wait_healthy(str(u).rstrip("/"), timeout, what="SGLang endpoint")
        yield url
        return
    if launch != "subprocess":
        raise ValueError(f"server.sglang.launch must be subprocess or attach, got {launch!r}")
    plan = build_plan(cfg, pick_port=free_port)  # every ValueError before any process starts
    for note in plan.notes:
        print(f"[sglang] note: {note}", flush=True)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "sglang-commands.sh").write_text(plan.describe() + "\n")
    with launch_plan(plan, workdir, timeout) as url:
        yield url


def compose(overrides: list[str]):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hcompose(config_name="config", overrides=list(overrides))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Start (or print) the SGLang deployment a run "
        "with these Hydra overrides would use."
    )
    ap.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    ap.add_argument("--workdir", default="outputs/sglang", help="logs go here")
    ap.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides, e.g. server=sglang system=hisparse server.sglang.model_path=...",
    )
    args = ap.parse_args(argv)
    try:
        cfg = compose(args.overrides)
        if args.dry_run:
            print(build_plan(cfg, pick_port=free_port).describe())
            return 0
        with sglang_server(cfg, Path(args.workdir)) as url:
            print(f"[sglang] serving at {url}; Ctrl-C stops it", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    except ValueError as e:  # a config SGLang cannot run: say why, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
