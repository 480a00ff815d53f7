"""benchmarks/ncu_lines.py's phase ranges: every marker is found in its kernel's source, in order,
so a profile's samples can be summed per phase (a renamed comment fails here, not on the GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import ncu_lines as nl  # noqa: E402


@pytest.mark.parametrize("file", sorted(nl.PHASE_MARKERS))
def test_phase_ranges_cover_the_kernel_in_order(file):
    src = dict(enumerate((REPO / "systems" / "kernels" / file).read_text().splitlines(), 1))
    ranges = [item.partition("=") for item in nl.phase_ranges(src, file).split(",")]
    names = [name for name, _, _ in ranges]
    assert names == [n for n, _ in nl.PHASE_MARKERS[file] if n is not None]
    spans = [tuple(int(x) for x in span.split(":")) for _, _, span in ranges]
    assert all(lo <= hi for lo, hi in spans)
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no gaps


def test_unknown_kernel_file_is_refused():
    with pytest.raises(SystemExit, match="no phase markers"):
        nl.phase_ranges({}, "attention.py")
