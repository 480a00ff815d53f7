"""Unpack a GPU batch's results.tgz (benchmarks/gpu_batch.sh) over the repository.

    python -m harness.unpack /path/to/results.tgz [--root .] [--force] [--runs-only]

A finished run in the archive (its directory holds summary.json) replaces the local directory of
the same run id whole: a run re-measured under ``harness.reproduce --rerun-before`` must not keep
files of the measurement it replaces (compressed records, pruning notes, profiles), which a
plain ``tar x`` over the old directory would leave beside the new ones. An archived finished run
measured before the local one is not unpacked (a stale archive; ``--force`` unpacks it), and a
failed attempt never lands in a finished local run: it goes beside it as ``<run id>.failed-<time>``.
Everything else (server logs, experiments' summaries) is extracted as it is.

Nothing local changes until the whole archive has been extracted into a staging folder under the
root and every finished run in it is whole (summary, config and env): a truncated archive, a full
disk or Ctrl-C during extraction leaves the tree as it was. A finished run is then swapped in by
two renames. Prints what it replaced; then run ``make compact`` and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path, PurePosixPath

# what every finished run directory holds (harness.run writes them before its summary)
RUN_FILES = ("summary.json", "config.yaml", "env.json")


def finished_run_dirs(names: list[str]) -> set[PurePosixPath]:
    """results/<experiment>/<run id> of every archived run that holds a summary.json."""
    out = set()
    for n in names:
        p = PurePosixPath(n)
        if p.name == "summary.json" and len(p.parts) == 4 and p.parts[0] == "results":
            out.add(p.parent)
    return out


def _measured_at(run: Path) -> str:
    try:
        return str(json.loads((run / "env.json").read_text()).get("time_utc") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def _extract(tar: tarfile.TarFile, members: list, stage: Path) -> None:
    try:  # regular files and folders only (Python's "data" filter, where this Python has it)
        tar.extractall(stage, members=members, filter="data")
    except TypeError:  # pragma: no cover - Python without extraction filters
        tar.extractall(stage, members=members)


def _move_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)


def unpack(
    archive: str | Path, root: str | Path = ".", force: bool = False, runs_only: bool = False
) -> tuple[list[str], list[str]]:
    """Extract ``archive`` under ``root``; returns the finished run directories it unpacked and
    those of them that replaced a local one. A ValueError for a file that is no whole tar
    archive, a member that would land outside ``root`` or is no regular file or folder, or a
    finished run missing one of RUN_FILES; nothing local has changed then. ``runs_only``: the
    finished runs alone (no logs, summaries or failed attempts), and a local run of the same
    measurement stays as it is (gpu_batch.sh restoring a machine's earlier batches)."""
    root = Path(root).resolve()
    try:
        tar = tarfile.open(archive)
    except tarfile.ReadError as e:
        raise ValueError(f"{archive}: not a tar archive ({e})") from None
    stage = root / f".unpack-{os.getpid()}"
    try:
        with tar:
            try:
                members = tar.getmembers()
            except (tarfile.TarError, EOFError, OSError) as e:
                raise ValueError(
                    f"{archive}: truncated or corrupt ({e}); nothing unpacked"
                ) from None
            for m in members:  # never outside the repository, nothing but files and folders
                target = (root / m.name).resolve()
                if not target.is_relative_to(root) or not (m.isfile() or m.isdir()):
                    raise ValueError(
                        f"refusing archive member {m.name!r}: outside {root}, a link or a special file"
                    )
            try:
                _extract(tar, members, stage)
            except (tarfile.TarError, EOFError) as e:
                raise ValueError(
                    f"{archive}: truncated or corrupt ({e}); nothing unpacked"
                ) from None
        runs = sorted(finished_run_dirs([m.name for m in members]))
        for d in runs:
            missing = [f for f in RUN_FILES if not (stage / d / f).is_file()]
            if missing:
                raise ValueError(
                    f"{d}: a finished run without {', '.join(missing)}; nothing unpacked"
                )
        return _swap_in(stage, root, runs, force, runs_only)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _swap_in(
    stage: Path, root: Path, runs: list, force: bool, runs_only: bool = False
) -> tuple[list[str], list[str]]:
    """Move what ``stage`` holds into ``root``: finished runs whole (two renames), the rest file
    by file (``runs_only``: not), a failed attempt beside a finished local run rather than into
    it."""
    unpacked, replaced = [], []
    whole = set(runs)
    stamp = int(time.time())
    for d in runs:
        local, new = root / d, stage / d
        if local.exists():
            if not force and (local / "summary.json").exists():
                if runs_only and _measured_at(new) == _measured_at(local):
                    continue  # the same measurement: nothing to do
                if _measured_at(new) < _measured_at(local):
                    print(
                        f"[unpack] kept {d}: the local run was measured later "
                        f"({_measured_at(local)} against {_measured_at(new)}; --force replaces it)"
                    )
                    continue
            # aside under a name the figures skip until the new run is in place (an interrupted
            # swap leaves it there, not lost), then removed
            old = local.with_name(f"{local.name}.superseded-unpack-{stamp}")
            local.rename(old)
            new.rename(local)
            shutil.rmtree(old)
            replaced.append(str(d))
        else:
            local.parent.mkdir(parents=True, exist_ok=True)
            new.rename(local)
        unpacked.append(str(d))
    if runs_only:
        return unpacked, replaced
    for f in sorted(p for p in stage.rglob("*") if p.is_file()):
        rel = f.relative_to(stage)
        parts = PurePosixPath(rel.as_posix()).parts
        if PurePosixPath(*parts[:3]) in whole:
            continue  # a finished run kept out above
        run = PurePosixPath(*parts[:3]) if len(parts) >= 4 and parts[0] == "results" else None
        if (
            run is not None
            and not run.parts[2].startswith(".")
            and (root / run / "summary.json").exists()
        ):
            # an unfinished attempt of a run finished here: beside it, never merged into it
            dst = root / run.parent / f"{run.name}.failed-{stamp}" / PurePosixPath(*parts[3:])
        else:
            dst = root / rel
        _move_file(f, dst)
    return unpacked, replaced


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("archive")
    ap.add_argument("--root", default=".", help="the repository root (default: here)")
    ap.add_argument(
        "--force",
        action="store_true",
        help="also replace a local finished run measured after the archived one",
    )
    ap.add_argument(
        "--runs-only",
        action="store_true",
        help="only the finished runs (no server logs, summaries or failed attempts), each named; "
        "a local run of the same measurement stays",
    )
    args = ap.parse_args(argv)
    if not Path(args.archive).is_file():
        ap.error(f"no such archive: {args.archive}")
    try:
        runs, replaced = unpack(args.archive, args.root, args.force, args.runs_only)
    except ValueError as e:
        ap.error(str(e))
    for d in replaced if not args.runs_only else runs:
        print(f"[unpack] {'replaced' if d in replaced else 'restored'} {d}")
    print(
        f"[unpack] {len(runs)} finished run(s) from {args.archive} "
        f"({len(runs) - len(replaced)} new, {len(replaced)} replaced) under {args.root}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
