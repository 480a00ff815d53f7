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


def unpack(archive: str | Path, root: str | Path = ".") -> list[str]:
    """Extract ``archive`` under ``root``; returns the run directories it replaced."""
    root = Path(root).resolve()
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for m in members:  # never outside the repository
            target = (root / m.name).resolve()
            if not target.is_relative_to(root) or m.issym() or m.islnk():
                raise ValueError(f"refusing archive member {m.name!r}")
        replaced = []
        for d in sorted(finished_run_dirs([m.name for m in members])):
            local = root / d
            if local.exists():
                shutil.rmtree(local)
                replaced.append(str(d))
        tar.extractall(root, members=members)
    return replaced


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("archive")
    ap.add_argument("--root", default=".", help="the repository root (default: here)")
    args = ap.parse_args(argv)
    if not Path(args.archive).is_file():
        ap.error(f"no such archive: {args.archive}")
    for d in unpack(args.archive, args.root):
        print(f"[unpack] replaced {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
