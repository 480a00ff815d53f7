"""A SIGTERM to the harness (a time box ending a sweep) stops the server it started."""

import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the harness's situation: a started (tracked) server, and the main thread inside an asyncio
# loop whose callbacks swallow exceptions (the load generator's socket reads)
SCRIPT = r"""
import asyncio, subprocess, sys
from harness.servers import exit_on_sigterm, track
exit_on_sigterm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
track(child)
print(child.pid, flush=True)

async def main():
    loop = asyncio.get_running_loop()
    def tick():
        try:
            loop.call_later(0.01, tick)
        except BaseException:
            pass  # swallowed, as a transport callback's error is
    tick()
    await asyncio.sleep(120)

asyncio.run(main())
"""


def _children(pid: int) -> set[int]:
    """Linux: the processes ``pid`` started (none once it is gone)."""
    path = f"/proc/{pid}/task/{pid}/children"
    return {int(p) for p in open(path).read().split()} if os.path.exists(path) else set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of the (dead) parent is reaped by init; treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_stops_the_server_child():
    env = dict(os.environ, PYTHONPATH=REPO)
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


RESTORE = r"""
import os, signal, sys, time
from pathlib import Path
from harness.run import _restore_superseded
from harness.servers import exit_on_sigterm, on_sigterm
exit_on_sigterm()
root = Path(sys.argv[1])
d, old = root / "run", root / "run.superseded-1"
old.mkdir(); (old / "summary.json").write_text("{}")  # the earlier measurement, moved aside
d.mkdir(); (d / "config.yaml").write_text("{}")  # the re-measurement under way
with on_sigterm(lambda: _restore_superseded(d, old)):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


def test_a_time_box_during_a_re_measurement_puts_the_earlier_run_back(tmp_path):
    """--rerun-before moves a finished run aside while it is measured again; a time box's
    SIGTERM (whose handler exits without unwinding) must put it back, its attempt aside."""
    proc = subprocess.run(
        [sys.executable, "-c", RESTORE, str(tmp_path)], cwd=REPO, timeout=60, capture_output=True
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert (tmp_path / "run" / "summary.json").exists()
    assert not (tmp_path / "run.superseded-1").exists()
    failed = [p.name for p in tmp_path.iterdir() if p.name.startswith("run.failed-")]
    assert len(failed) == 1 and (tmp_path / failed[0] / "config.yaml").exists()


def test_stopping_a_group_whose_leader_died_stops_its_children():
    """A server that crashes at start-up can leave its children (SGLang's schedulers) in its
    process group: stopping it signals the group whatever the leader's state, until none is
    left."""
    from harness.servers import _group_alive, stop_process

    proc = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & exit 0"], start_new_session=True)
    proc.wait(timeout=10)  # the leader is gone; its two children live on in its group
    assert _group_alive(proc.pid)
    stop_process(proc, grace_s=5, group=True)
    assert not _group_alive(proc.pid)
