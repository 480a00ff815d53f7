"""Compress the request records of finished runs before they are committed.

    python -m harness.compact [--results results] [--dry-run] [--prune-unused] [--prune-traces]

A finished run (one with ``summary.json``) keeps ``records.jsonl`` as ``records.jsonl.xz``
(an earlier ``records.jsonl.gz`` is re-packed the same way); every reader
(``harness.records.read_jsonl``, the figure scripts) takes any of the three forms. Runs still
in progress, or interrupted ones, are left alone: the load generator appends to their file.
The request records are most of the bytes under ``results/`` (one JSON line per request with its
token timestamps), and the GPU machine takes at most 64 MiB of working tree per call: xz at
preset 9 keeps them about a third smaller than gzip did (1.10 against 1.55 MB for a Fig. 1 run of
256 requests x 1,024 tokens). A finished run's ``server_metrics.jsonl`` (the /metrics samples as
streamed during the run) goes once its ``server_metrics.parquet`` holds every sample.

``--prune-unused`` asks the figures what they read (``figures.make_all --inputs`` in a child
process) and removes, from the experiments they list, every committed request-records file and
``server_metrics.parquet`` they do not open; a note in the run names the commit to restore from.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.environment import REPO
from harness.records import _fsync_dir
from harness.results import PRUNED_NOTE, finished_runs


def _write_xz(src_open, target: Path) -> int:
    """Write ``target`` (.xz) from a readable binary stream, durably and atomically; its size."""
    tmp = target.with_name(target.name + ".tmp")
    with src_open() as src, open(tmp, "wb") as raw:
        # no timestamp in the container: the same records always give the same bytes
        with lzma.LZMAFile(raw, mode="wb", format=lzma.FORMAT_XZ, preset=9) as dst:
            shutil.copyfileobj(src, dst)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, target)
    _fsync_dir(str(target.parent))  # the .xz is durable before its source goes
    return target.stat().st_size


def compact(results: Path, dry_run: bool = False) -> tuple[int, int, int]:
    """Returns (files compressed or re-packed, bytes before, bytes after)."""
    n = before = after = 0
    for suf in (".gz.tmp", ".xz.tmp"):  # an earlier compaction cut short
        for stale in results.rglob("records.jsonl" + suf):
            if not dry_run:
                stale.unlink()
    finished = [
        p
        for p in sorted(results.rglob("records.jsonl*"))
        if p.name in ("records.jsonl", "records.jsonl.gz") and (p.parent / "summary.json").is_file()
    ]
    for rec in finished:
        xz = rec.parent / "records.jsonl.xz"
        size = rec.stat().st_size
        n, before = n + 1, before + size
        if dry_run:
            continue
        if rec.suffix == ".gz":
            after += _write_xz(lambda rec=rec: gzip.open(rec, "rb"), xz)
        else:
            after += _write_xz(lambda rec=rec: open(rec, "rb"), xz)
        rec.unlink()
    return n, before, after


def drop_streamed_metrics(results: Path, dry_run: bool = False) -> tuple[int, int]:
    """Remove ``server_metrics.jsonl`` (the /metrics samples streamed during a run, so an interrupted
    run keeps them) from finished runs whose ``server_metrics.parquet`` holds every one of its
    samples (the form every reader takes). Returns (files removed, bytes)."""
    import pyarrow.parquet as pq_lib

    n = size = 0
    for js in sorted(results.rglob("server_metrics.jsonl")):
        pq = js.parent / "server_metrics.parquet"
        if not ((js.parent / "summary.json").is_file() and pq.is_file()):
            continue
        with open(js, "rb") as f:
            lines = sum(1 for line in f if line.strip())
        try:
            rows = pq_lib.read_metadata(pq).num_rows  # the footer says; no need to read the data
        except Exception:  # an unreadable parquet: keep the samples it was made from
            continue
        if rows < lines:
            continue
        n, size = n + 1, size + js.stat().st_size
        if not dry_run:
            js.unlink()
    return n, size


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess | None:
    """``git args`` run in ``cwd`` (None where git cannot run there)."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def _committed_unchanged(path: Path) -> bool:
    """Whether ``path`` is tracked and unchanged against HEAD (so git keeps its bytes)."""
    tracked = _git(path.parent, "ls-files", "--error-unmatch", path.name)
    same = _git(path.parent, "diff", "--quiet", "HEAD", "--", path.name)
    return bool(tracked and tracked.returncode == 0 and same and same.returncode == 0)


def figure_inputs(results: Path) -> dict[str, set[Path]]:
    """What the figures read from ``results``, as resolved paths: the experiment directories they
    list, the request records and server samples they open, and the runs at a newer output cap
    they will plot once its sweep is complete (``figures.make_all --inputs``, run in a child
    process: the harness imports nothing from the figures). Raises where a script fails, since
    its reads would then be missing."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        cmd = [sys.executable, "-m", "figures.make_all", "--results", str(results.resolve())]
        cmd += ["--out", str(t / "out"), "--report", str(t / "R.md")]
        cmd += ["--claims", str(t / "claims.json"), "--inputs", str(t / "inputs.json")]
        p = subprocess.run(
            [*cmd, "--dpi", "30", "--quiet"], cwd=REPO, capture_output=True, text=True
        )
        if p.returncode != 0 or not (t / "inputs.json").is_file():
            raise RuntimeError(
                "figures.make_all failed, so what the figures read is unknown; nothing pruned:\n"
                + (p.stderr or p.stdout)[-3000:]
            )
        listed = json.loads((t / "inputs.json").read_text())
    root = results.resolve()
    return {kind: {root / rel for rel in paths} for kind, paths in listed.items()}


# the files of a finished run that --prune-unused may remove: summary, config and env always stay
PRUNABLE = ("records.jsonl", "records.jsonl.gz", "records.jsonl.xz", "server_metrics.parquet")


def prune_unused(results: Path, dry_run: bool = False) -> tuple[list[Path], list[Path]]:
    """Remove the request records and server samples that no figure reads (an older output cap,
    a setting re-measured since, a repeat whose samples the notes take from a newer one) from
    the finished runs of the experiments the figures read, where git keeps their bytes at HEAD.
    Runs the figures never list (a benchmark's own folder, lane_interference/) and runs at a
    newer output cap waiting for its sweep to complete keep everything. Each pruned run keeps
    its summary, config and env, and a RECORDS_PRUNED.txt naming the commit to restore from.
    Returns (pruned files, files kept because git does not hold them unchanged)."""
    read = figure_inputs(results)
    head, top = _git_head(results)
    pruned, kept = [], []
    for exp in sorted(read["experiments"]):
        for run in finished_runs(results, exp.name):
            if run.path.resolve() in read["waiting"]:
                continue
            for f in (run.path / name for name in PRUNABLE):
                if not f.is_file() or f.resolve() in read["files"]:
                    continue
                done = _remove_committed(
                    f,
                    run.path / PRUNED_NOTE,
                    "--prune-unused",
                    "no figure reads it",
                    head,
                    top,
                    dry_run,
                )
                (pruned if done else kept).append(f)
    return pruned, kept


def _git_head(results: Path) -> tuple[str | None, Path | None]:
    """(short HEAD, repository root) of the repository holding ``results``; (None, None) outside one."""
    head = _git(results, "rev-parse", "--short", "HEAD")
    top = _git(results, "rev-parse", "--show-toplevel")
    if not (head and head.returncode == 0 and top and top.returncode == 0):
        return None, None  # not in a git repository: nothing is held by git, nothing is pruned
    return head.stdout.strip(), Path(top.stdout.strip()).resolve()


def _remove_committed(
    path: Path, note: Path, flag: str, why: str, head: str | None, top: Path | None, dry_run: bool
) -> bool:
    """Delete ``path`` where git holds it unchanged at HEAD, appending to ``note`` the command that
    restores it; False (and nothing removed) where git does not hold its bytes."""
    if head is None or not _committed_unchanged(path):
        return False
    if not dry_run:
        with open(note, "a", encoding="utf-8") as f:
            f.write(
                f"{path.name}: removed by `python -m harness.compact {flag}` ({why}); restore with: "
                f"git checkout {head} -- {path.resolve().relative_to(top)}\n"
            )
        path.unlink()
    return True


TRACES_NOTE = "TRACES_PRUNED.txt"


def prune_traces(results: Path, dry_run: bool = False) -> tuple[list[Path], list[Path]]:
    """Remove the kernel-profiler traces (``kernels/trace_*.json[.gz]``, for Perfetto) of finished
    runs where git holds them unchanged at HEAD: the figures read ``kernel_summary.json`` and
    ``kernel_steps.csv``, which stay; a TRACES_PRUNED.txt beside them names the commit to restore
    the traces from. Returns (pruned, kept because git does not hold them unchanged)."""
    head, top = _git_head(results)
    pruned, kept = [], []
    for summary in sorted(results.glob("*/*/summary.json")):
        kdir = summary.parent / "kernels"
        for tr in sorted(kdir.glob("trace_*.json*")):
            done = _remove_committed(
                tr,
                kdir / TRACES_NOTE,
                "--prune-traces",
                "the figures read kernel_summary.json",
                head,
                top,
                dry_run,
            )
            (pruned if done else kept).append(tr)
    return pruned, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--results", default="results", help="results root (default: results)")
    ap.add_argument(
        "--dry-run", action="store_true", help="list what would be compressed (or pruned)"
    )
    ap.add_argument(
        "--prune-unused",
        action="store_true",
        help="also remove the request records and server samples no figure reads (runs "
        "figures.make_all --inputs does not list: superseded output caps, settings re-measured "
        "since) where git holds them unchanged at HEAD; a note in the run directory names the "
        "commit to restore them from",
    )
    ap.add_argument(
        "--prune-traces",
        action="store_true",
        help="also remove the kernel profiler's Perfetto traces (kernels/trace_*.json.gz) of finished "
        "runs where git holds them unchanged at HEAD (the figures read kernel_summary.json); a "
        "note beside them names the commit to restore them from",
    )
    args = ap.parse_args(argv)
    root = Path(args.results)
    if not root.is_dir():
        print(f"[compact] no such directory: {root}", file=sys.stderr)
        return 2
    for wanted, prune, what in (
        (args.prune_unused, prune_unused, "records and server-sample files no figure reads"),
        (args.prune_traces, prune_traces, "kernel traces"),
    ):
        if not wanted:
            continue
        pruned, kept = prune(root, args.dry_run)
        size = sum(p.stat().st_size for p in pruned) if args.dry_run else None
        print(
            f"[compact] {'would prune' if args.dry_run else 'pruned'} {len(pruned)} {what}"
            + (f" ({size / 2**20:.1f} MiB)" if size is not None else "")
            + (
                f"; kept {len(kept)} that git does not hold unchanged (commit them first)"
                if kept
                else ""
            )
        )
    m, msize = drop_streamed_metrics(root, args.dry_run)
    print(
        f"[compact] {'would remove' if args.dry_run else 'removed'} {m} streamed server_metrics.jsonl "
        f"({msize / 2**20:.1f} MiB) whose samples server_metrics.parquet holds"
    )
    n, before, after = compact(root, args.dry_run)
    if args.dry_run:
        print(f"[compact] would compress {n} records files ({before / 2**20:.1f} MiB)")
    else:
        print(
            f"[compact] compressed {n} records files: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
