"""Compress the request records of finished runs before they are committed.

    python -m harness.compact [--results results] [--dry-run]

A finished run (one with ``summary.json``) keeps ``records.jsonl`` as ``records.jsonl.gz``;
every reader (``harness.records.read_jsonl``, the figure scripts) takes either form. Runs still
in progress, or interrupted ones, are left alone: the load generator appends to their file.
The request records are most of the bytes under ``results/`` (one JSON line per request with its
token timestamps), and the GPU machine takes at most 64 MiB of working tree per call.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
from pathlib import Path

from harness.records import _fsync_dir


def compact(results: Path, dry_run: bool = False) -> tuple[int, int, int]:
    """Returns (files compressed, bytes before, bytes after)."""
    n = before = after = 0
    for stale in results.rglob("records.jsonl.gz.tmp"):  # an earlier compaction cut short
        if not dry_run:
            stale.unlink()
    for rec in sorted(results.rglob("records.jsonl")):
        if not (rec.parent / "summary.json").is_file():
            continue
        gz = rec.with_name(rec.name + ".gz")
        size = rec.stat().st_size
        if dry_run:
            n, before = n + 1, before + size
            continue
        tmp = gz.with_name(gz.name + ".tmp")
        # mtime=0: the same records always give the same bytes (no churn in git)
        with open(rec, "rb") as src, open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as dst:
                shutil.copyfileobj(src, dst)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, gz)
        _fsync_dir(str(gz.parent))  # the .gz is durable before the plain file goes
        rec.unlink()
        n, before, after = n + 1, before + size, after + gz.stat().st_size
    return n, before, after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="results root (default: results)")
    ap.add_argument("--dry-run", action="store_true", help="list what would be compressed")
    args = ap.parse_args(argv)
    root = Path(args.results)
    if not root.is_dir():
        print(f"[compact] no such directory: {root}", file=sys.stderr)
        return 2
    n, before, after = compact(root, args.dry_run)
    if args.dry_run:
        print(f"[compact] would compress {n} records.jsonl files ({before / 2**20:.1f} MiB)")
    else:
        print(f"[compact] compressed {n} records.jsonl files: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
