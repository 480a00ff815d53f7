"""Unpack a GPU batch's results.tgz (benchmarks/gpu_batch.sh) over the repository.

    python -m harness.unpack /path/to/results.tgz [--root .]

A finished run in the archive (its directory holds summary.json) replaces the local directory of
the same run id whole: a run re-measured under ``harness.reproduce --rerun-before`` must not keep
files of the measurement it replaces (compressed records, pruning notes, profiles), which a
plain ``tar x`` over the old directory would leave beside the new ones. Everything else (failed
attempts, server logs, experiments' summaries) is extracted as it is. Prints what it replaced;
then run ``make compact`` and commit.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
from pathlib import Path, PurePosixPath


def finished_run_dirs(names: list[str]) -> set[PurePosixPath]:
    """results/<experiment>/<run id> of every archived run that holds a summary.json."""
    out = set()
    for n in names:
        p = PurePosixPath(n)
        if p.name == "summary.json" and len(p.parts) == 4 and p.parts[0] == "results":
            out.add(p.parent)
    return out


def unpack(archive: str | Path, root: str | Path = ".") -> tuple[list[str], list[str]]:
    """Extract ``archive`` under ``root``; returns the finished run directories it held and
    those of them it replaced. A ValueError for a file that is no tar archive, or a member that
    would land outside ``root``."""
    root = Path(root).resolve()
    try:
        tar = tarfile.open(archive)
    except tarfile.ReadError as e:
        raise ValueError(f"{archive}: not a tar archive ({e})") from None
    with tar:
        members = tar.getmembers()
        for m in members:  # never outside the repository
            target = (root / m.name).resolve()
            if not target.is_relative_to(root) or m.issym() or m.islnk():
                raise ValueError(f"refusing archive member {m.name!r}: outside {root} or a link")
        runs = sorted(finished_run_dirs([m.name for m in members]))
        replaced = []
        for d in runs:
            local = root / d
            if local.exists():
                shutil.rmtree(local)
                replaced.append(str(d))
        tar.extractall(root, members=members)
    return [str(d) for d in runs], replaced


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("archive")
    ap.add_argument("--root", default=".", help="the repository root (default: here)")
    args = ap.parse_args(argv)
    if not Path(args.archive).is_file():
        ap.error(f"no such archive: {args.archive}")
    try:
        runs, replaced = unpack(args.archive, args.root)
    except ValueError as e:
        ap.error(str(e))
    for d in replaced:
        print(f"[unpack] replaced {d}")
    print(
        f"[unpack] {len(runs)} finished run(s) from {args.archive} "
        f"({len(runs) - len(replaced)} new, {len(replaced)} replaced) under {args.root}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
