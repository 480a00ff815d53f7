"""Row-copy kernel (TRITON_INTERPRET=1 on CPU) against the reference, both ways (backup to the
host store, restore into device pages): every source's row lands at its destination row, bit
for bit, and nothing else in the destination changes."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import backup as bk  # noqa: E402
from tests.kernels.support import interpreted  # noqa: E402

pytestmark = interpreted(bk._copy_rows_kernel)


@pytest.mark.parametrize(
    "S,NG,NH,rb,N,programs",
    [
        (1, 5, 7, 4, 1, None),
        (3, 41, 53, 656, 9, None),
        (2, 9, 30, 6, 5, None),
        (5, 17, 40, 34, 17, None),
        # a bounded grid: blocks loop over (source, tile) pairs, the last tile partial; fewer
        # blocks than sources, and more blocks than pairs
        (3, 41, 53, 656, 37, 7),
        (3, 41, 53, 656, 37, 2),
        (2, 60, 70, 6, 41, 1),
        (1, 9, 30, 34, 5, 4),
        (5, 17, 40, 34, 17, 3),
        (2, 9, 30, 6, 3, 64),
    ],
)
def test_kernel_matches_reference(S, NG, NH, rb, N, programs):
    g = torch.Generator().manual_seed(S * 100 + rb)
    kv = torch.randint(0, 256, (S, NG, rb), generator=g, dtype=torch.uint8)
    host0 = torch.randint(0, 256, (S, NH, rb), generator=g, dtype=torch.uint8)
    dev_rows = torch.randint(0, NG, (N,), generator=g)
    host_rows = torch.randperm(NH, generator=g)[:N]  # distinct destinations
    want, got = host0.clone(), host0.clone()
    bk.copy_rows_reference(kv, want, dev_rows, host_rows)
    bk.backup_rows(kv, got, dev_rows, host_rows, impl="triton", programs=programs)
    assert torch.equal(got, want)
    untouched = torch.ones(NH, dtype=torch.bool)
    untouched[host_rows] = False
    assert torch.equal(got[:, untouched], host0[:, untouched])
    assert torch.equal(got[:, host_rows], kv[:, dev_rows])


def test_no_rows_is_a_no_op_and_bad_shapes_are_refused():
    kv = torch.zeros(2, 4, 8, dtype=torch.uint8)
    host = torch.ones(2, 6, 8, dtype=torch.uint8)
    bk.backup_rows(
        kv,
        host,
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        impl="triton",
    )
    assert int(host.min()) == 1
    with pytest.raises(ValueError, match="pools disagree"):
        bk.copy_rows_triton(
            kv, torch.ones(3, 6, 8, dtype=torch.uint8), torch.zeros(1).long(), torch.zeros(1).long()
        )
    with pytest.raises(ValueError, match="programs must be None or >= 1"):
        bk.copy_rows_triton(kv, host, torch.zeros(1).long(), torch.zeros(1).long(), programs=0)
    with pytest.raises(ValueError, match="unknown row-copy impl"):
        bk.backup_rows(kv, host, torch.zeros(1).long(), torch.zeros(1).long(), impl="cuda")


@pytest.mark.parametrize("S,NG,NH,rb,N", [(1, 5, 7, 4, 1), (3, 41, 53, 656, 9), (2, 9, 30, 6, 5)])
def test_restore_matches_reference(S, NG, NH, rb, N):
    """Host store rows into device pages (adaptive population): the same kernel, reversed."""
    g = torch.Generator().manual_seed(S * 7 + rb)
    host = torch.randint(0, 256, (S, NH, rb), generator=g, dtype=torch.uint8)
    kv0 = torch.randint(0, 256, (S, NG, rb), generator=g, dtype=torch.uint8)
    host_rows = torch.randint(0, NH, (N,), generator=g)
    dev_rows = torch.randperm(NG, generator=g)[:N]
    want, got = kv0.clone(), kv0.clone()
    bk.copy_rows_reference(host, want, host_rows, dev_rows)
    bk.restore_rows(host, got, host_rows, dev_rows, impl="triton")
    assert torch.equal(got, want)
    assert torch.equal(got[:, dev_rows], host[:, host_rows])
