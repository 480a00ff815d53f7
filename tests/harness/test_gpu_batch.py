"""benchmarks/gpu_batch.sh, the GPU batch driver, run on CPU with stub commands: a lane item
becomes the right harness.reproduce or benchmark command on its lane's GPU, and the archive that
comes back holds what the batch wrote, not the folders that were already there. (A mistake here
costs device time: one batch's archive of whole folders passed the 16 MB a returned file may
have, and its runs were lost.)"""

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STUB_PY = r"""#!/usr/bin/env bash
# python3 stand-in: log the call, and act like harness.reproduce / a benchmark on disk
echo "GPU=${CUDA_VISIBLE_DEVICES:-none} $*" >> "$STUB_LOG"
if [ "$1" = "-m" ] && [ "$2" = "harness.reproduce" ]; then
  exp="$4"; d="results/$exp/stub-$exp-$RANDOM$RANDOM"
  mkdir -p "$d" "results/$exp/.server-stub" && echo '{}' > "$d/config.yaml"
  echo "{\"time_utc\": \"$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)\"}" > "$d/env.json"
  echo '{}' > "$d/summary.json"
  echo "appended" >> "results/$exp/.server-stub/server.log"
  echo "a server" > "results/$exp/.server-stub/server-$RANDOM$RANDOM.log"
  echo "reproduced $exp"
elif [ "$1" = "-m" ] && [ "$2" = "harness.unpack" ]; then
  exec "$REAL_PY" "$@"  # the real one
elif [ "${1##*/}" = "bench_resolver.py" ]; then
  echo '{}' > "$3"
fi
exit 0
"""

STUB_IDLE = "#!/usr/bin/env bash\nexec sleep 30\n"


def _stub_bin(tmp_path, python_stub: str):
    """A PATH folder whose python3 is ``python_stub`` and whose monitors idle."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", python_stub), ("nvidia-smi", STUB_IDLE), ("vmstat", STUB_IDLE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _work_tree(path: Path) -> Path:
    """A repository copy holding gpu_batch.sh, as the device tool's copy of the tree."""
    (path / "benchmarks").mkdir(parents=True)
    shutil.copy(REPO / "benchmarks" / "gpu_batch.sh", path / "benchmarks")
    return path


def _run_batch(work: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """gpu_batch.sh with ``args`` in ``work``, to its end; its exit status checked."""
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_batch.sh", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _batch_env(tmp_path, bin_dir, out, **extra) -> dict:
    """The environment of a stubbed batch: stub commands first on PATH, its own $OUT, this test's
    kept-archives folder (a machine's earlier batches) and a quick packer."""
    return dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        OUT=str(out),
        STUB_LOG=str(tmp_path / "calls.log"),
        REAL_PY=sys.executable,
        PYTHONPATH=str(REPO),
        DHS_KEEP_BATCHES=str(tmp_path / "kept"),
        # the packer's pending `sleep` outlives the batch holding the captured stdout open, so
        # subprocess.run waits that long for EOF: 1 s here, not the default 30 s
        DHS_PACK_EVERY="1",
        **extra,
    )


@pytest.mark.skipif(
    shutil.which("timeout") is None or shutil.which("tar") is None,
    reason="needs coreutils timeout and tar",
)
def test_lane_items_become_commands_and_only_new_runs_come_back(tmp_path):
    work = _work_tree(tmp_path / "repo")
    shutil.copytree(REPO / "conf" / "experiment", work / "conf" / "experiment")
    (work / ".whl").mkdir()
    old = work / "results" / "fig9" / "old-run"
    old.mkdir(parents=True)
    (old / "summary.json").write_text("{}")
    log_dir = work / "results" / "fig9" / ".server-stub"
    log_dir.mkdir()
    (log_dir / "server.log").write_text("old\n")
    untouched = work / "results" / "fig5" / ".server-quiet"
    untouched.mkdir(parents=True)
    (untouched / "server.log").write_text("old\n")
    past = time.time() - 3600
    for p in (old, old / "summary.json", log_dir, log_dir / "server.log", untouched / "server.log"):
        os.utime(p, (past, past))

    bin_dir = _stub_bin(tmp_path, STUB_PY)
    out = tmp_path / "out"
    stub_log = tmp_path / "calls.log"
    env = _batch_env(
        tmp_path,
        bin_dir,
        out,
        DHS_ARGS_bench_resolver="--skip a,c",
        DHS_ARGS_bench_resolver_2="--skip b",
        DHS_PREDRAW="dsv41_h200 glm53_h200",
    )
    proc = _run_batch(
        work,
        env,
        "fig4_more+system=hisparse+point=c256+ov=^rerun=2:20 @bench_resolver:20 "
        "@bench_resolver#2:20",
        "fig9+where=b_over_k=4,8+system=hisparse fig5+rerun-before=20261203T103000Z:20",
        "--",
        "engine.disable_cuda_graph=true",
    )
    calls = stub_log.read_text().splitlines()
    assert (
        "GPU=0 -m harness.reproduce --only fig4_more --results results --system hisparse "
        "--point c256 +rerun=2 engine.disable_cuda_graph=true"
    ) in calls
    assert (
        "GPU=1 -m harness.reproduce --only fig9 --results results --where b_over_k=4,8 "
        "--system hisparse engine.disable_cuda_graph=true"
    ) in calls
    assert (
        "GPU=1 -m harness.reproduce --only fig5 --results results --rerun-before 20261203T103000Z "
        "engine.disable_cuda_graph=true" in calls
    )
    # the presets' weights drawn beside the batch, in a process of their own
    for _ in range(50):
        if any("systems.models.predraw" in c for c in stub_log.read_text().splitlines()):
            break
        time.sleep(0.1)
    assert "-m systems.models.predraw dsv41_h200 glm53_h200" in stub_log.read_text()
    # one throwaway serving run per lane, before its items, all in one run group
    assert sum("+prewarm=1" in c for c in calls) == 2
    assert proc.stdout.count("[gpu_batch] run group ") == 1
    assert f"GPU=0 benchmarks/bench_resolver.py --out {out}/bench_resolver.json --skip a,c" in calls
    # the same benchmark again with its own arguments and output file
    assert f"GPU=0 benchmarks/bench_resolver.py --out {out}/bench_resolver_2.json --skip b" in calls
    assert (out / "lane0.log").read_text().startswith("[lane 0] fig4_more")
    # each experiment's whole output comes back beside the lane log's tail
    assert (out / "reproduce-fig9.log").read_text() == "reproduced fig9\n"
    with tarfile.open(out / "results.tgz") as tar:
        names = tar.getnames()
    new_runs = {n.split("/")[2] for n in names if n.count("/") == 2 and "/stub-" in n}
    assert len(new_runs) == 3  # one per harness call, from both lanes
    assert "results/fig9/.server-stub/server.log" in names  # changed inside an old folder
    assert not any("old-run" in n or ".server-quiet" in n for n in names)


STUB_SLOW_PY = r"""#!/usr/bin/env bash
# python3 stand-in: a reproduce call that finishes one run, leaves one cut (no summary.json),
# then runs until its time box (or the device tool) stops it
echo "GPU=${CUDA_VISIBLE_DEVICES:-none} $*" >> "$STUB_LOG"
if [ "$1" = "-m" ] && [ "$2" = "harness.reproduce" ]; then
  mkdir -p "results/$4/finished" "results/$4/cut" "results/$4/failed"
  echo '{}' > "results/$4/finished/summary.json"; echo '{}' > "results/$4/cut/records.jsonl"
  echo 'RuntimeError' > "results/$4/failed/error.txt"
  # a run whose folder the pack's first look missed (here: dated before the batch) while its
  # summary.json is new: that file must not come back without the rest of its run
  mkdir -p "results/$4/racy" && echo '{}' > "results/$4/racy/summary.json"
  touch -d '2000-01-01' "results/$4/racy"
  exec sleep 60
fi
exit 0
"""


@pytest.mark.skipif(
    shutil.which("timeout") is None or shutil.which("tar") is None,
    reason="needs coreutils timeout and tar",
)
def test_a_batch_cut_off_still_returns_its_finished_runs(tmp_path):
    """The device tool stops a call at its limit, before the batch's last pack: the runs
    finished (or failed) by then still come back (re-packed every DHS_PACK_EVERY seconds), a run
    cut in the middle does not, and DHS_BATCH_SECONDS caps the items' time boxes (an item with no time
    left is skipped rather than started)."""
    work = _work_tree(tmp_path / "repo")
    bin_dir = _stub_bin(tmp_path, STUB_SLOW_PY)
    out = tmp_path / "out"
    env = _batch_env(tmp_path, bin_dir, out, DHS_PREWARM="0", DHS_BATCH_SECONDS="70")
    proc = subprocess.Popen(
        ["bash", "benchmarks/gpu_batch.sh", "fig7_h200:500 fig5:500"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 30
        while not (out / "results.tgz").exists() and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(1.5)
    finally:
        os.killpg(proc.pid, 9)  # as the device tool's limit does: no trap, no last pack
        proc.wait()
    with tarfile.open(out / "results.tgz") as tar:
        names = tar.getnames()
    assert "results/fig7_h200/finished/summary.json" in names
    assert "results/fig7_h200/failed/error.txt" in names  # a failure says why
    assert not any("/cut" in n for n in names)
    assert not any("/racy" in n for n in names)
    # 70 s less 30 for the last pack: the first item's box is 40 s, not 500
    log = (out / "lane0.log").read_text()  # 39 where a second ticks between start and item
    assert "[lane 0] fig7_h200 (time box 40 s)" in log or "(time box 39 s)" in log


@pytest.mark.skipif(
    shutil.which("timeout") is None or shutil.which("tar") is None,
    reason="needs coreutils timeout and tar",
)
def test_a_later_batch_on_the_same_machine_starts_from_the_earlier_ones_runs(tmp_path):
    """Three calls on one held machine, each with a fresh copy of the tree (the device tool's):
    each unpacks the runs the calls before it finished (harness.unpack --runs-only) before its
    items run, and sends back only its own runs and server logs."""
    bin_dir = _stub_bin(tmp_path, STUB_PY)
    seen = {}
    for call in (1, 2, 3):
        work = _work_tree(tmp_path / f"repo{call}")
        out = tmp_path / f"out{call}"
        proc = _run_batch(work, _batch_env(tmp_path, bin_dir, out, DHS_PREWARM="0"), "fig6:20")
        seen[call] = sorted(p.name for p in (work / "results" / "fig6").glob("stub-*"))
        with tarfile.open(out / "results.tgz") as tar:
            names = tar.getnames()
        assert len({n.split("/")[2] for n in names if "/stub-" in n}) == 1  # its own run
        assert sum("/server-" in n for n in names) == 1  # its own server's log
    assert [len(seen[c]) for c in (1, 2, 3)] == [1, 2, 3]
    assert set(seen[1]) < set(seen[2]) < set(seen[3])
    assert proc.stdout.count("an earlier batch here: [unpack] restored") == 2
