"""Every command the README shows works as written, each run here in its smallest form.

The commands are read from the README's ``bash`` blocks, so a command added there without a way
to run it here fails ``test_every_readme_command_is_covered``. ``make`` commands run what
``make -n`` says they run (the venv set-up left out: the tests already run in it). The load
generator runs against what ``make server`` starts (the default server), on a free port.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PY = ".venv/bin/python"
# what "smallest form" adds to a command, per module: fewer / shorter requests, scratch output
SMALL_RUN = [
    "server.mode=inprocess",
    "workload.concurrency=[1]",
    "workload.num_requests=1",
    "workload.output_len=2",
    "workload.warmup=0",
]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for line in lines:
            cmd = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if cmd:
                out.append(cmd)
    return out


def split(cmd: str) -> tuple[dict, list[str]]:
    """Leading VAR=value words are the environment; the rest is the command."""
    words = shlex.split(cmd)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def make_expansion(words: list[str], env: dict) -> list[list[str]]:
    """The python commands a make invocation runs (``make -n``), the venv set-up left out."""
    r = subprocess.run(
        ["make", "-n", "-s", *words[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    lines = [
        ln
        for ln in r.stdout.splitlines()
        if ln.startswith(f"{PY} -m ") and not ln.startswith(f"{PY} -m pip ")
    ]
    return [shlex.split(ln)[2:] for ln in lines]  # [module, args...]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python(module_args: list[str], env: dict, tmp: Path, timeout: float = 300) -> str:
    r = subprocess.run(
        [sys.executable, "-m", *module_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), "WANDB_DIR": str(tmp), "HOME": str(tmp), **env},
    )
    assert r.returncode == 0, (
        f"{module_args}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return r.stdout + r.stderr


def smallest(module_args: list[str], tmp: Path) -> list[str]:
    """The command in its smallest form: same module and arguments, small load, scratch output."""
    mod, args = module_args[0], list(module_args[1:])
    if mod == "harness.run":
        return [
            mod,
            *args,
            *SMALL_RUN,
            f"results_dir={tmp / 'results'}",
            f"hydra.run.dir={tmp / 'hydra'}",
            f"hydra.sweep.dir={tmp / 'multirun'}",
        ]
    if mod == "harness.reproduce":
        if "--only" not in args:
            args += ["--only", "fig10_dsv_eager"]  # the experiment with the fewest runs
        return [mod, *args, "--results", str(tmp / "results")]
    if mod == "figures.make_all":
        # results/ in its smallest form too: one committed experiment (a copy), unless a command
        # before this one wrote runs there. On the whole of results/ the report's pending-runs
        # paragraph composes every planned run's config (~20 s), as
        # tests/harness/test_reproduce_checks.py's committed-plan test does to check them all
        res = tmp / "results"
        if not res.exists():
            shutil.copytree(REPO / "results" / "fig10_eager", res / "fig10_eager")
        return [
            mod,
            *args,
            "--results",
            str(res),
            "--only",
            "table1",
            "--out",
            str(tmp / "out"),
            "--report",
            str(tmp / "REPRODUCTION.md"),
            "--claims",
            str(tmp / "claims.json"),
        ]
    if mod == "harness.wandb_logger":
        (tmp / "out").mkdir(exist_ok=True)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.figure(figsize=(1, 1)).savefig(tmp / "out" / "table1.png")
        plt.close("all")
        return [mod, "--attach-figures", str(tmp / "out")]
    if mod == "figures.sweep":
        # a committed run copied in as the sweep's, unless a command before wrote runs there
        exp = tmp / "results" / args[0]
        if not list(exp.glob("*/summary.json")):
            run = next(
                iter(sorted((REPO / "results" / "fig10_eager").glob("*/summary.json")))
            ).parent
            shutil.copytree(run, exp / run.name)
        return [mod, *args, "--results", str(tmp / "results"), "--out", str(tmp / "out")]
    if mod == "harness.dashboard":
        return [mod, *args, "--out", str(tmp / "dashboard.json")]
    return [mod, *args]


def run_command(cmd: str, tmp: Path) -> None:
    env, words = split(cmd)
    env.setdefault("WANDB_MODE", "offline")
    if env["WANDB_MODE"] == "online":  # no key, no network: must fall back, never fail
        env.update(WANDB_BASE_URL="http://127.0.0.1:9", WANDB_API_KEY="")
    if words[0] == "make":
        target = words[1]
        if target == "test":
            assert make_expansion(words, env) == [
                ["ruff", "check", "."],
                ["ruff", "format", "--check", "."],
                ["pytest", "-n", "2", "--dist", "loadgroup", "--no-solo", "tests"],
                ["pytest", "--solo-only", "tests"],
            ]
            return  # this very suite
        if target == "reproduce" and "DRY=1" not in words and not _has_gpu():
            r = subprocess.run(
                ["make", "-s", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=60
            )
            assert r.returncode != 0 and "needs a CUDA GPU" in r.stdout
            assert len(r.stdout.strip().splitlines()) == 1
            return
        if target == "server":
            return  # started by the load generator's command, below
        expansion = make_expansion(words, env)
        assert expansion, f"{cmd}: make -n runs no python command"
        for module_args in expansion:
            if module_args in _run_by_the_plain_command(cmd):
                continue
            if module_args[:1] in (["harness.compact"],):
                continue  # compaction of results/ (GPU path, after the runs)
            out = python(smallest(module_args, tmp), env, tmp)
            if module_args[0] == "harness.dashboard" and env["WANDB_MODE"] == "online":
                assert "publishing failed" in out and "definition written" in out, out[-2000:]
        return
    assert words[0] == PY and words[1] == "-m", f"not a command this test knows: {cmd}"
    module_args = words[2:]
    if module_args[0] == "harness.loadgen":
        _loadgen_against_default_server(module_args, env, tmp)
        return
    if module_args[0] == "harness.reproduce" and "--smoke" in module_args:
        module_args = module_args + ["--only", "fig10_dsv_eager"]
    python(smallest(module_args, tmp), env, tmp)


def _run_by_the_plain_command(cmd: str) -> list[list[str]]:
    """The python commands of ``cmd`` that the README's same make command without variables
    (``make figures`` for ``make figures WANDB=1``, same environment) runs too: that command's
    test runs them, once."""
    env, words = split(cmd)
    plain = [w for w in words if "=" not in w]
    if plain == words or not any(split(c) == (env, plain) for c in COMMANDS):
        return []
    return make_expansion(plain, env)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _loadgen_against_default_server(module_args: list[str], env: dict, tmp: Path) -> None:
    (server,) = make_expansion(["make", "server"], {})
    port = free_port()
    server = [a if a != "30000" else str(port) for a in server]
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", *server],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except Exception:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    tmp / "server.log"
                ).read_text()[-3000:]
                time.sleep(0.3)
        args = [a.replace("http://127.0.0.1:30000", url) for a in module_args]
        out = python(args, env, tmp)
        assert re.search(r"completed\s+16", out) and re.search(r"errors\s+0", out), out[-2000:]
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


COMMANDS = readme_commands()


def test_every_readme_command_is_covered():
    assert any(c.startswith("make run") for c in COMMANDS)
    assert any("harness.loadgen" in c for c in COMMANDS)
    for cmd in COMMANDS:
        env, words = split(cmd)
        assert words[0] == "make" or words[:2] == [PY, "-m"], f"unknown kind of command: {cmd}"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_works(cmd, tmp_path):
    run_command(cmd, tmp_path)
