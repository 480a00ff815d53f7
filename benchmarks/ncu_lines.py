"""Join Nsight Compute's per-instruction stall samples with a cubin's line table.

    python benchmarks/ncu_lines.py CASE_sass.csv CASE.cubin [--file resolver.py] [--top 40]

CASE_sass.csv is ``ncu -i CASE.ncu-rep --page source --csv --print-source sass`` (benchmarks/gpu_ncu.sh
writes it); CASE.cubin is the profiled kernel (ncu_resolver.py --dump-cubin). ``nvdisasm -g`` gives each
instruction offset's source line; the samples of every profiled launch are summed per line and per
stall reason. Prints the lines with the most samples and the share of each contiguous line range
named in --ranges (e.g. A=688:719,B=720:762), or with ``--ranges phases`` of the kernel's phases,
found from the phase comments in its source (the resolver's, or the top-k's with --file topk.py).
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path


def add_call_args(ap) -> None:
    """The arguments every single-kernel call script for Nsight Compute takes."""
    ap.add_argument("--calls", type=int, default=6, help="calls after the compile call")
    ap.add_argument(
        "--dump-cubin",
        default="",
        metavar="PATH",
        help="write the compiled kernel's cubin here (nvdisasm -g maps its instructions to source "
        "lines; benchmarks/ncu_lines.py joins that with ncu's per-instruction samples)",
    )


def require_cuda(who: str):
    """torch, or exit: the call scripts exist to be profiled on the GPU machine."""
    import torch

    if not torch.cuda.is_available():
        sys.exit(
            f"{who}: no CUDA device here (this script exists to be profiled on the GPU machine)"
        )
    return torch


def dump_cubin(jit_fn, path: str, who: str) -> None:
    """Write the one compiled variant of a Triton kernel to ``path`` (nothing when empty)."""
    if not path:
        return
    kernels = [k for cache in jit_fn.device_caches.values() for k in cache[0].values()]
    if len(kernels) != 1:
        sys.exit(f"{who}: expected one compiled variant, found {len(kernels)}")
    Path(path).write_bytes(kernels[0].asm["cubin"])


def nvdisasm() -> str:
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    sys.exit("ncu_lines: nvdisasm not found (CUDA toolkit or Triton's bundled copy)")


def line_table(cubin: str, file_part: str) -> dict[int, int]:
    """Instruction offset -> source line of ``file_part``. Instructions of other files (Triton's
    reductions and scans, inlined without call-site info) go to the last ``file_part`` line before
    them: the statement that called them, as far as the line table tells."""
    out = subprocess.run(
        [nvdisasm(), "-g", "-c", cubin], capture_output=True, text=True, check=True
    ).stdout
    table, line = {}, -1
    for text in out.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if m:
            if file_part in m.group(1):
                line = int(m.group(2))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/", text)
        if m:
            table[int(m.group(1), 16)] = line
    return table


def kernels(path: str):
    """The CSV's kernels: (header, rows) per profiled launch."""
    header, cur, out = None, None, []
    for row in csv.reader(open(path)):
        if row and row[0] == "Kernel Name":
            cur = []
            out.append(cur)
        elif row and row[0] == "Address":
            header = row
        elif cur is not None and len(row) > 10:
            cur.append(row)
    return header, out


# the comments that open each part of a kernel, in source order, per kernel source file
RESOLVER_PHASES = (
    ("helpers", "def _victim_key("),
    ("role", "# ---- role"),
    ("A", "-- phase A"),
    ("B", "-- phase B"),
    ("C", "-- phase C"),
    ("V", "-- phase V"),
    ("D", "-- phase D"),
    ("reset", "-- reset the scratch"),
    ("copy", "copy phase (every program)"),
    ("end", "if COPY_PROGRAMS and PID_ROLES:"),
    (None, "# Workspace"),
)
TOPK_PHASES = (
    ("helpers", "def _keys("),  # inlined: their samples land on these lines
    ("setup", "def _topk_kernel("),
    ("histograms", "# 1. the top 16 bits of the threshold key"),
    ("compaction", "# 2. entries on the 16-bit threshold"),
    ("candidates", "# 3. the low 16 bits of the threshold"),
    ("segment_out", "# 4a. the segment's winners"),
    ("winners", "# 4b. candidates above the threshold"),
    ("sort", "# 5. the n_win = min(k, selectable) winners"),
    (None, "def _p2("),
)
PHASE_MARKERS = {"resolver.py": RESOLVER_PHASES, "topk.py": TOPK_PHASES}


def phase_ranges(src: dict[int, str], file: str = "resolver.py") -> str:
    """--ranges for a kernel's parts: each from its marker line to the next one's."""
    if file not in PHASE_MARKERS:
        sys.exit(f"ncu_lines: no phase markers for {file!r} (known: {', '.join(PHASE_MARKERS)})")
    at = []
    for name, marker in PHASE_MARKERS[file]:
        line = next(
            (n for n, text in sorted(src.items()) if marker in text and (not at or n > at[-1][1])),
            None,
        )
        if line is None:
            sys.exit(f"ncu_lines: marker {marker!r} not found in the kernel source")
        at.append((name, line))
    return ",".join(f"{name}={lo}:{hi - 1}" for (name, lo), (_, hi) in zip(at, at[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sass_csv")
    ap.add_argument("cubin")
    ap.add_argument("--file", default="resolver.py")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--ranges", default="")
    args = ap.parse_args()
    table = line_table(args.cubin, args.file)
    header, launches = kernels(args.sass_csv)
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    per_line = collections.defaultdict(collections.Counter)
    total = 0
    for rows in launches:
        if len(rows) != len(table):
            sys.exit(
                f"ncu_lines: {len(rows)} instructions profiled, {len(table)} in the cubin: not the same kernel"
            )
        base = int(rows[0][0], 16)
        for row in rows:
            line = table[int(row[0], 16) - base]
            n = int(row[col["Warp Stall Sampling (All Samples)"]])
            total += n
            per_line[line]["samples"] += n
            per_line[line]["executed"] += int(row[col["Instructions Executed"]])
            for s in stalls:
                per_line[line][s[6:]] += int(row[col[s]])
    print(f"{len(launches)} launches, {total} samples")
    src = {}
    for p in Path(".").rglob(args.file):
        src = dict(enumerate(p.read_text().splitlines(), 1))
        break
    for line, c in sorted(per_line.items(), key=lambda kv: -kv[1]["samples"])[: args.top]:
        top = ", ".join(
            f"{k} {v / max(1, c['samples']) * 100:.0f}%"
            for k, v in sorted(
                ((k, v) for k, v in c.items() if k not in ("samples", "executed")),
                key=lambda kv: -kv[1],
            )[:3]
        )
        print(
            f"{line:5d} {c['samples'] / max(1, total) * 100:5.1f}%  [{top}]  {src.get(line, '').strip()[:70]}"
        )
    ranges = phase_ranges(src, args.file) if args.ranges == "phases" else args.ranges
    for item in (x for x in ranges.split(",") if x):
        name, _, span = item.partition("=")
        lo, _, hi = span.partition(":")
        n = sum(c["samples"] for line, c in per_line.items() if int(lo) <= line <= int(hi))
        print(f"range {name} ({lo}-{hi}): {n / max(1, total) * 100:.1f}% of samples")


if __name__ == "__main__":
    main()
