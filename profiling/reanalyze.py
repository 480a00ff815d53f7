"""Re-derive committed kernel summaries from their traces with today's classifier.

    python -m profiling.reanalyze results/fig10_h200 results/fig10_dsv_h200/<run> ...

A profiled run keeps ``kernels/kernel_summary.json`` and ``kernel_steps.csv`` (what the figures
read); its torch.profiler traces are pruned from the tree once summarised
(``harness.compact --prune-traces``), and ``kernels/TRACES_PRUNED.txt`` names the commit that
still holds each. When the classifier changes (``profiling.kernel_timeline.NAME_PATTERNS``), the
summaries are re-derived here from those traces, read out of git history into a scratch folder
(they do not come back into the tree), with each cycle's window and step range as recorded and
the engine's session counts kept. Nothing ran on a GPU again: the kernels, their times and their
ranges are the committed measurement's.

Arguments are run directories or experiment directories (every run under them with a kernel
summary). Prints each run's step shares before and after; ``--dry-run`` writes nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from profiling.kernel_timeline import analyze_trace, write_rows_csv

REPO = Path(__file__).resolve().parents[1]
_RESTORE = re.compile(r"^(trace_\d+\.json(?:\.gz)?):.*git checkout (\w+) -- (\S+)")


def traces(kernels: Path, scratch: Path) -> list[Path]:
    """The run's traces in cycle order: those in the folder, else each pruned one read out of
    the commit its note names. [] when a cycle's trace cannot be had (then nothing is redone)."""
    here = sorted(kernels.glob("trace_*.json*"), key=_cycle)
    if here:
        return here
    note = kernels / "TRACES_PRUNED.txt"
    if not note.is_file():
        return []
    out = []
    for line in note.read_text().splitlines():
        m = _RESTORE.match(line.strip())
        if not m:
            continue
        name, commit, path = m.groups()
        blob = subprocess.run(
            ["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, check=False
        )
        if blob.returncode != 0:
            print(f"[reanalyze] {kernels}: {name} not in {commit}", file=sys.stderr)
            return []
        dst = scratch / f"{abs(hash(str(kernels)))}-{name}"
        dst.write_bytes(blob.stdout)
        out.append(dst)
    return sorted(out, key=_cycle)


def _cycle(p: Path) -> int:
    return int(re.search(r"trace_(\d+)", p.name).group(1))


def reanalyze(kernels: Path, scratch: Path, dry_run: bool = False) -> tuple[dict, dict] | None:
    """(old, new) summary of the run's first cycle, after rewriting its files; None where its
    traces cannot be had."""
    path = kernels / "kernel_summary.json"
    old = json.loads(path.read_text())
    found = traces(kernels, scratch)
    if len(found) != len(old["cycles"]):
        return None
    cycles, steps = [], []
    for n, (trace, before) in enumerate(zip(found, old["cycles"], strict=True)):
        rep = analyze_trace(trace, step_range=old.get("step_range"), window=old["window"])
        if "sessions_per_step" in before:  # the engine's count, not in the trace
            rep.summary["sessions_per_step"] = before["sessions_per_step"]
        cycles.append(rep.summary)
        steps += [{**r, "cycle": n} for r in rep.steps]
    if not dry_run:
        path.write_text(json.dumps({**old, "cycles": cycles}, indent=1))
        write_rows_csv(steps, kernels / "kernel_steps.csv")
    return old["cycles"][0], cycles[0]


def _shares(summary: dict) -> str:
    sh = summary.get("share_of_step_pct") or {}
    return " ".join(f"{k}={v:.1f}" for k, v in sh.items() if v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m profiling.reanalyze", description=__doc__)
    ap.add_argument("paths", nargs="+", type=Path, help="run or experiment directories")
    ap.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = ap.parse_args(argv)
    runs = sorted({s.parent for p in args.paths for s in p.glob("**/kernels/kernel_summary.json")})
    if not runs:
        print("[reanalyze] no kernels/kernel_summary.json under the paths given", file=sys.stderr)
        return 1
    missing = 0
    with tempfile.TemporaryDirectory(prefix="dhs-traces-") as tmp:
        for kernels in runs:
            res = reanalyze(kernels, Path(tmp), args.dry_run)
            if res is None:
                missing += 1
                print(f"[reanalyze] {kernels.parent}: no trace for every cycle, left as it is")
                continue
            old, new = res
            print(f"{kernels.parent}\n  before: {_shares(old)}\n  after:  {_shares(new)}")
    return 0 if missing < len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
