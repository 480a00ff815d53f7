"""systems/host_copy.py: the 2-D copy's geometry, and the copy itself where both sides are on
the CPU. The GPU path runs in benchmarks/bench_host_copy.py (bytes checked against the source)
and under every HiSparse-family backend in check_cuda_graph (golden tokens)."""

import pytest
import torch

from systems.host_copy import copy_blocks_to_host, pitches


def test_pitches_of_a_run_of_every_source():
    pool = torch.zeros(5, 40, 7, dtype=torch.uint8)
    kv = torch.arange(5 * 13 * 7, dtype=torch.int64).to(torch.uint8).view(5, 13, 7)
    dst, src = pool[:, 20:29], kv[:, 3:12]
    assert pitches(dst, src) == (40 * 7, 13 * 7, 9 * 7, 5)
    wide = torch.zeros(5, 40, 7, dtype=torch.bfloat16)
    assert pitches(wide[:, :9], kv.to(torch.bfloat16)[:, :9]) == (40 * 14, 13 * 14, 9 * 14, 5)


@pytest.mark.parametrize(
    "dst, src",
    [
        (torch.zeros(3, 8, 4)[:, :, :2], torch.zeros(3, 8, 2)),  # rows not contiguous
        (torch.zeros(3, 8, 4), torch.zeros(3, 4, 8).transpose(1, 2)),  # rows strided
        (torch.zeros(3, 8, 4), torch.zeros(3, 8, 4, dtype=torch.float64)),  # dtypes differ
        (torch.zeros(3, 8, 4), torch.zeros(3, 7, 4)),  # shapes differ
        (torch.zeros(8, 4), torch.zeros(8, 4)),  # not (S, n, row)
        (torch.zeros(3, 4, 5), torch.zeros(30).as_strided((3, 4, 5), (5, 5, 1))),  # overlap
        (torch.zeros(3, 4, 5), torch.zeros(4, 5).expand(3, 4, 5)),  # one block, read thrice
    ],
)
def test_no_pitches_where_one_call_cannot_copy(dst, src):
    assert pitches(dst, src) is None


def test_a_single_row_run_has_pitches_whatever_its_row_stride():
    pool = torch.zeros(4, 10, 6)
    assert pitches(pool[:, 2:3], torch.ones(4, 3, 6)[:, 1:2]) == (240, 72, 24, 4)


def test_copy_on_the_cpu_is_the_strided_copy():
    pool = torch.zeros(6, 50, 9, dtype=torch.uint8)
    kv = torch.randint(0, 256, (6, 31, 9), dtype=torch.uint8)
    assert copy_blocks_to_host(pool[:, 11:28], kv[:, 4:21]) == 1
    assert torch.equal(pool[:, 11:28], kv[:, 4:21])
    assert not pool[:, :11].any() and not pool[:, 28:].any()
    assert copy_blocks_to_host(pool[:, 0:0], kv[:, 0:0]) == 0
