"""The drafter's ring attention: Triton kernel (TRITON_INTERPRET=1 on CPU, float32 compute)
against the reference (gather the slots' rings, append the block, one SDPA call)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import ring_attention as ra  # noqa: E402
from tests.kernels.support import interpreted, needs_nvidia_backend, run_compiled  # noqa: E402

pytestmark = interpreted(ra._ring_attention_kernel)


def _case(B, L, d, R, S, seed, dead_ring=()):
    """Random rings and blocks, and a mask like the drafter's: a window of ring rows per request
    (some rows of the ring masked), the block causal; requests in ``dead_ring`` see no ring row
    (a fresh request's first block), so whole chunks of their keys are masked."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, d, generator=g)
    ring_k, ring_v = torch.randn(2, S, R, d, generator=g)
    k, v = torch.randn(2, B, L, d, generator=g)
    slots = torch.randperm(S, generator=g)[:B].to(torch.int32)
    M = R + L
    allowed = torch.zeros(B, L, M, dtype=torch.bool)
    for b in range(B):
        if b not in dead_ring:
            allowed[b, :, :R] = torch.rand(R, generator=g) < 0.7
    allowed[:, :, R:] = torch.ones(L, L, dtype=torch.bool).tril()
    Mp = -(-M // 8) * 8  # the drafter's padded rows, read through a view
    bias = torch.full((B, 1, L, Mp), float("-inf"))[..., :M]
    bias.masked_fill_(allowed.unsqueeze(1), 0.0)
    return q, ring_k, ring_v, slots, k, v, bias


@pytest.mark.parametrize(
    "B,L,d,R,S,chunk",
    [(1, 1, 40, 37, 2, None), (3, 4, 40, 53, 5, 16), (2, 3, 24, 130, 3, 32), (4, 5, 72, 21, 6, 16)],
)
def test_kernel_matches_reference(B, L, d, R, S, chunk):
    args = _case(B, L, d, R, S, seed=B * 100 + R, dead_ring=(1,) if B > 1 else ())
    scale = d**-0.5
    ref = ra.ring_attention_reference(*args, scale)
    tri = ra.ring_attention_triton(*args, scale, chunk_rows=chunk, block_n=16)
    torch.testing.assert_close(tri, ref, rtol=2e-5, atol=2e-5)


def test_a_request_is_computed_alone_whatever_the_batch():
    """Batch invariance: a request's output is the same bits alone as beside others (fixed
    chunks of keys, one request per program row), including with padding requests."""
    q, rk, rv, slots, k, v, bias = _case(5, 4, 40, 53, 6, seed=7)
    scale = 40**-0.5
    kw = dict(chunk_rows=16, block_n=16)
    full = ra.ring_attention_triton(q, rk, rv, slots, k, v, bias, scale, **kw)
    for b in (0, 3):
        one = slice(b, b + 1)
        alone = ra.ring_attention_triton(
            q[one], rk, rv, slots[one], k[one], v[one], bias[one], scale, **kw
        )
        assert torch.equal(alone[0], full[b])


def test_chunks_follow_the_key_count_alone():
    assert ra.chunk_count(2052, 32) == (17, 128)
    assert ra.chunk_count(37, 16, rows=16) == (3, 16)
    assert ra.chunk_count(1, 32) == (1, 128)


def test_unknown_impl_is_a_clear_error():
    with pytest.raises(ValueError, match="ring attention impl"):
        ra.ring_attention(*_case(1, 1, 8, 4, 2, 0), 1.0, impl="cuda")


_AOT = r"""
from systems.kernels import ring_attention as ra
for kw in (dict(), dict(L=8, d=256), dict(d=64, L=1), dict(L=ra.MAX_BLOCK)):
    k = ra.aot_compile(90, **kw)
    ptx = k.asm["ptx"]
    assert "mma.sync" in ptx or "wgmma" in ptx, kw  # bf16 tensor-core dots
    assert k.metadata.shared <= 232448, (kw, k.metadata.shared)  # sm_90's 227 KB
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_kernel_compiles_for_sm90_without_gpu():
    """Compile the real kernel for Hopper (bf16, split) in a process without TRITON_INTERPRET:
    tensor-core dots, and the shared memory the launch's stages take fits sm_90 at d = 512."""
    run_compiled(_AOT)


def test_a_block_longer_than_the_kernel_holds_takes_the_reference(monkeypatch):
    """Past MAX_BLOCK queries, or in a dtype its dots do not take, the dispatch runs the
    reference, never a kernel that would not fit or not compile."""
    monkeypatch.setattr(ra, "MAX_BLOCK", 2)
    monkeypatch.setattr(
        ra, "ring_attention_triton", lambda *a, **k: pytest.fail("kernel called for L > 2")
    )
    args = _case(2, 3, 8, 11, 3, seed=5)
    got = ra.ring_attention(*args, 0.5, impl="triton")
    torch.testing.assert_close(got, ra.ring_attention_reference(*args, 0.5))
    # and a dtype the kernel does not take here (float64; on a GPU anything but bf16)
    monkeypatch.setattr(ra, "MAX_BLOCK", 32)
    wide = [a.double() if a.is_floating_point() else a for a in args]
    torch.testing.assert_close(
        ra.ring_attention(*wide, 0.5, impl="triton"), ra.ring_attention_reference(*wide, 0.5)
    )


def test_auto_selfcheck_covers_the_ring_attention(monkeypatch):
    """A ring attention kernel that differs from its reference sends model.attention_impl=auto
    (and with it the drafter) to the references, with the reason; the real one passes."""
    from systems.kernels import selfcheck

    cpu = torch.device("cpu")
    monkeypatch.setattr(selfcheck, "_VERDICT", {})
    assert selfcheck.check_kernels(cpu) == (True, "ok")
    real = ra.ring_attention_triton
    monkeypatch.setattr(ra, "ring_attention_triton", lambda *a, **k: real(*a, **k) * 1.01)
    monkeypatch.setattr(selfcheck, "_VERDICT", {})
    ok, why = selfcheck.check_kernels(cpu)
    assert not ok and "ring attention differs" in why


def test_bench_script_cpu_dry_run(tmp_path):
    """benchmarks/bench_ring_attention.py end to end at toy sizes on CPU: its checks (against
    the reference, alone vs batched) pass for a one-chunk and a split config, and it writes a row
    per shape and config; a malformed config is refused before anything runs."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", "bench_ring_attention.py")
    out = tmp_path / "ring.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, script, "--cpu-dry-run", "--out", str(out)]
    res = subprocess.run(
        [*cmd, "--configs", "128x32x4x2", "32x16x4x1"],
        cwd=root, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["B"], r["config"]) for r in rows} == {
        (b, c) for b in (1, 3) for c in ("128x32x4x2", "32x16x4x1")
    }
    bad = subprocess.run(
        [*cmd, "--configs", "128x24x4x2"], cwd=root, env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "power of two" in bad.stderr
