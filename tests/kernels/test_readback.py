"""Readback kernel (TRITON_INTERPRET=1 on CPU) against the reference copy, and start_readback's
CPU path (a plain copy, no event)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.host_sync import start_readback  # noqa: E402
from systems.kernels import readback as rb  # noqa: E402
from tests.kernels.support import interpreted  # noqa: E402


@interpreted(rb._readback_kernel)
@pytest.mark.parametrize("n", [1, 7, rb.BLOCK - 1, rb.BLOCK, 2 * rb.BLOCK + 5])
def test_kernel_matches_reference(n):
    g = torch.Generator().manual_seed(n)
    src = torch.randint(-(2**62), 2**62, (n,), generator=g)
    want = torch.full((n + 3,), -7, dtype=torch.int64)
    got = want.clone()
    rb.readback(src, want[:n], impl="reference")
    rb.readback(src, got[:n], impl="triton")
    assert torch.equal(got, want)
    assert torch.equal(got[n:], torch.full((3,), -7))  # nothing past the end is written


@interpreted(rb._readback_kernel)
def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="readback"):
        rb.readback(torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="contiguous"):
        rb.readback(torch.zeros(3, 2, dtype=torch.int64).t(), torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown readback impl"):
        rb.readback(torch.zeros(1), torch.zeros(1), impl="memcpy")


def test_start_readback_on_cpu_is_a_finished_copy():
    t = torch.arange(6).view(2, 3)
    host, done = start_readback(t)
    assert done is None and torch.equal(host, t)
    t.add_(1)  # the host copy is its own memory
    assert torch.equal(host, torch.arange(6).view(2, 3))
