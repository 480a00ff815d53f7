"""Which implementation ``auto`` means for the model's Triton kernels, checked once per process.

``model.attention_impl: auto`` picks the Triton kernels (fused sparse attention, indexer scores)
on a GPU; for attention the all-heads tensor-core kernel (``triton_mma``), which the H200
measured at 1.5-3.3x the per-head split-K kernel from 16 queries up (docs/design.md).
Before the first use in a process, the kernels (attention, indexer scores, top-k, the
layer's fused norm / SiLU product / fp8 row encoding, in place too / index query blend, the
HiSparse step tables, the drafter's ring attention) run on a small
random case and are compared with their PyTorch references; if any raises or disagrees,
``auto`` falls back to the references for the whole process with a warning naming why, so a
kernel that misbehaves on some GPU or Triton build costs speed, never tokens. ``triton`` or
``reference`` skip the check.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("dhs.kernels")
_VERDICT: dict[str, tuple[bool, str]] = {}


def check_kernels(device: torch.device) -> tuple[bool, str]:
    """(ok, reason): both kernels agree with their references on ``device`` (cached)."""
    key = str(device)
    if key in _VERDICT:
        return _VERDICT[key]
    try:
        ok, why = _run(device)
    except Exception as e:  # a compile or launch failure is a verdict too
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        log.warning(
            "model.attention_impl=auto: the Triton kernels failed their self-check on %s "
            "(%s); using the PyTorch references",
            device,
            why,
        )
    _VERDICT[key] = (ok, why)
    return ok, why


def _run(device: torch.device) -> tuple[bool, str]:
    from systems.kernels.fused_ops import (
        add_rms_norm,
        blend_index_query,
        encode_fp8_rows,
        silu_mul,
    )
    from systems.kernels.index_scores import index_scores
    from systems.kernels.sparse_attention import sparse_attention
    from systems.kernels.topk import topk_positions
    from systems.models.config import ModelConfig
    from systems.models.kv_format import encode_rows

    g = torch.Generator(device="cpu").manual_seed(1)
    cfg = ModelConfig(kv_format="fp8", kv_dim=192, kv_rope_dim=64)
    kv = encode_rows(torch.randn(61, 192, generator=g), cfg).to(device)
    loc = torch.randint(0, 61, (5, 37), generator=g).to(device)
    sel = loc.clone()
    sel[:, -3:] = -1
    q = torch.randn(5, 3, 192, generator=g).to(device)
    kw = dict(kv_format="fp8", kv_dim=192, rope_dim=64, row_dtype=torch.float32)
    b = sparse_attention(q, kv, sel, loc, impl="reference", **kw)
    for impl in ("triton", "triton_mma"):
        a = sparse_attention(q, kv, sel, loc, impl=impl, **kw)
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-4):
            return False, f"sparse attention ({impl}) differs by {(a - b).abs().max().item():.3g}"
    if device.type == "cuda":  # the tensor-core path proper (bf16 in, fp32 accumulation)
        kw16 = dict(kw, row_dtype=torch.bfloat16)
        q16 = q.to(torch.bfloat16)
        a = sparse_attention(q16, kv, sel, loc, impl="triton_mma", **kw16).float()
        b = sparse_attention(q16, kv, sel, loc, impl="reference", **kw16).float()
        if not torch.allclose(a, b, rtol=2e-2, atol=2e-2):
            return (
                False,
                f"sparse attention (triton_mma, bf16) differs by {(a - b).abs().max().item():.3g}",
            )
    pool = torch.randn(8 * 16, 64, generator=g).to(device, torch.bfloat16)
    table = torch.randperm(8, generator=g).view(2, 4).to(device, torch.int32)
    slots = torch.tensor([1, 0], device=device)
    iq = torch.randn(2, 3, 64, generator=g).to(device)
    a = index_scores(iq, pool, table, slots, 50, 16, impl="triton")
    b = index_scores(iq, pool, table, slots, 50, 16, impl="reference")
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-4):
        return False, f"index scores differ by {(a - b).abs().max().item():.3g}"
    # the top-k must agree bit for bit: ties (a few distinct scores) broken by position
    scores = torch.randint(0, 4, (2, 3, 50), generator=g).float().to(device)
    positions = torch.tensor([[49, 20, 0], [60, 33, 7]], device=device)
    a = topk_positions(scores, positions, 12, impl="triton")
    if not torch.equal(a, topk_positions(scores, positions, 12, impl="reference")):
        return False, "top-k positions differ from the reference"
    # the layer's fused kernels: norm and SiLU product close, the fp8 rows byte for byte
    x, d = torch.randn(2, 3, 100, generator=g).to(device), torch.randn(2, 3, 100).to(device)
    for a, b in zip(add_rms_norm(x, d), add_rms_norm(x, d, impl="reference")):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-5):
            return False, f"add + RMSNorm differs by {(a - b).abs().max().item():.3g}"
    a, b = silu_mul(x, impl="triton"), silu_mul(x, impl="reference")
    if not torch.allclose(a, b, rtol=1e-5, atol=1e-5):
        return False, f"SiLU product differs by {(a - b).abs().max().item():.3g}"
    rows = torch.randn(7, 192, generator=g).to(device) * 4
    want = encode_rows(rows, cfg)
    if not torch.equal(encode_fp8_rows(rows, 192, 64, cfg.row_bytes), want):
        return False, "fp8 row encoding differs from the reference"
    pool = torch.zeros(11, cfg.row_bytes, dtype=torch.uint8, device=device)
    dst = torch.tensor([9, 0, 4, 10, 2, 7, 5], device=device)
    encode_fp8_rows(rows, 192, 64, cfg.row_bytes, pool, dst)
    if not torch.equal(pool[dst], want):
        return False, "fp8 row encoding in place differs from the reference"
    w = torch.randn(100, generator=g).to(device)
    a, b = blend_index_query(x, w, 0.3), blend_index_query(x, w, 0.3, impl="reference")
    if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
        return False, f"index query blend differs by {(a - b).abs().max().item():.3g}"
    ok, why = _check_ring_attention(device, g)
    if not ok:
        return ok, why
    return _check_step_tables(device, g)


def _check_ring_attention(device: torch.device, g: torch.Generator) -> tuple[bool, str]:
    """The drafter's ring attention against its reference, in the dtype the drafter runs it in
    (bf16 on a GPU; float32 in the interpreter), over two chunks of keys with a masked window."""
    from systems.kernels.ring_attention import ring_attention, ring_attention_reference

    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    ring_k, ring_v = (torch.randn(3, 150, 64, generator=g).to(device, dt) for _ in range(2))
    q, k, v = (torch.randn(2, 3, 64, generator=g).to(device, dt) for _ in range(3))
    slots = torch.tensor([2, 0], device=device)
    bias = torch.zeros(2, 1, 3, 153, dtype=dt, device=device)
    bias[..., :40] = float("-inf")  # ring rows outside the window
    a = ring_attention(q, ring_k, ring_v, slots, k, v, bias, 0.125, impl="triton").float()
    b = ring_attention_reference(q, ring_k, ring_v, slots, k, v, bias, 0.125).float()
    tol = 2e-2 if dt == torch.bfloat16 else 1e-4
    if not torch.allclose(a, b, rtol=tol, atol=tol):
        return False, f"ring attention differs by {(a - b).abs().max().item():.3g}"
    return True, "ok"


def _check_step_tables(device: torch.device, g: torch.Generator) -> tuple[bool, str]:
    from systems.kernels.step_tables import step_tables

    def table(*shape, hi):
        return torch.randint(-1, hi, shape, generator=g, dtype=torch.int32).to(device)

    args = (
        torch.tensor([3, 0, 5], device=device),
        torch.randint(0, 40, (3, 2), generator=g).to(device),
        table(6, 5, hi=30),
        8,
        torch.randint(0, 100, (6,), generator=g, dtype=torch.int32).to(device),
        torch.randint(0, 9, (6,), generator=g, dtype=torch.int32).to(device),
        table(6, 7, hi=90),
        table(3, 6, 7, hi=60),
    )
    kw = dict(S=3, NG=320, G=32, hot=12, T=10)
    a, b = step_tables(*args, **kw), step_tables(*args, impl="reference", **kw)
    for k in b:
        if not torch.equal(a[k], b[k]):
            return False, f"step tables ({k}) differ from the reference"
    return True, "ok"


def resolve_impl(requested: str, device: torch.device) -> str:
    """``auto`` -> ``triton_mma`` on a GPU whose kernels pass the self-check, else ``reference``."""
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "reference"
    return "triton_mma" if check_kernels(device)[0] else "reference"
