"""Byte formats of one stored KV row.

Rows are stored as opaque ``uint8`` rows so that every KV tier (device pools, pinned host store,
staging) and the resolver's copies are format-agnostic: exactness is byte equality.

fp8 layout (the 656-byte row of the paper for kv_dim=576, rope=64):
    [ nope values as float8_e4m3fn | one float32 scale per 128 nope values | rope values as bf16 ]
"""

from __future__ import annotations

import torch

from systems.models.config import ModelConfig

FP8_MAX = 448.0
FP8_BLOCK = 128


def encode_rows(x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """(..., kv_dim) float -> (..., row_bytes) uint8."""
    lead = x.shape[:-1]
    if cfg.kv_format == "bf16":
        return x.to(torch.bfloat16).contiguous().view(torch.uint8).reshape(*lead, cfg.row_bytes)
    nope_dim = cfg.kv_dim - cfg.kv_rope_dim
    xf = x.float()
    nope = xf[..., :nope_dim].reshape(*lead, nope_dim // FP8_BLOCK, FP8_BLOCK)
    # over a tensor, not a Python scalar: torch on a GPU turns a division by a Python scalar into
    # a product with its reciprocal (another last bit than the CPU's division); a true division
    # gives the same bytes on every device and from the kernel, and decode -> encode is exact
    amax = nope.abs().amax(-1, keepdim=True).clamp_min(1e-8)
    scale = amax / torch.full_like(amax, FP8_MAX)  # (..., nb, 1)
    q = (nope / scale).to(torch.float8_e4m3fn).reshape(*lead, nope_dim)
    parts = [
        q.view(torch.uint8),
        scale.reshape(*lead, -1).contiguous().view(torch.uint8).reshape(*lead, -1),
    ]
    if cfg.kv_rope_dim:
        parts.append(xf[..., nope_dim:].to(torch.bfloat16).contiguous().view(torch.uint8))
    return torch.cat(parts, dim=-1)


def decode_rows(b: torch.Tensor, cfg: ModelConfig, dtype: torch.dtype) -> torch.Tensor:
    """(..., row_bytes) uint8 -> (..., kv_dim) in ``dtype``."""
    lead = b.shape[:-1]
    b = b.contiguous()
    if cfg.kv_format == "bf16":
        return b.view(torch.bfloat16).reshape(*lead, cfg.kv_dim).to(dtype)
    nope_dim = cfg.kv_dim - cfg.kv_rope_dim
    nb = nope_dim // FP8_BLOCK
    q = b[..., :nope_dim].contiguous().view(torch.float8_e4m3fn).float()
    scale = b[..., nope_dim : nope_dim + 4 * nb].contiguous().view(torch.float32)
    nope = (q.reshape(*lead, nb, FP8_BLOCK) * scale.reshape(*lead, nb, 1)).reshape(*lead, nope_dim)
    if cfg.kv_rope_dim:
        rope = b[..., nope_dim + 4 * nb :].contiguous().view(torch.bfloat16).float()
        nope = torch.cat([nope, rope.reshape(*lead, cfg.kv_rope_dim)], dim=-1)
    return nope.to(dtype)
