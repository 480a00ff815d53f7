"""Greedy and temperature sampling over a batch, one host sync per step."""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    generator: torch.Generator | None = None,
    any_sampled: bool | None = None,
) -> torch.Tensor:
    """logits (B, V) float32, temperatures (B,) -> token ids (B,). Temperature 0 is argmax.
    ``any_sampled``: whether any temperature is > 0, when the caller knows it on the host (then
    greedy batches never sync with the device here)."""
    return _sample(logits, temperatures, generator, any_sampled, draw)


def sample_on_host(
    logits: torch.Tensor, temperatures: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``sample`` for CPU tensors, drawing by inverse CDF (``draw_by_cdf``). Why: admission
    samples each request's first token on the engine thread from the prefill's host logits,
    where ``torch.multinomial`` over a 32K vocabulary takes ~0.6 ms a row (a request's first
    token cost ~2 ms of the engine thread's CPU in fig5_h200); a cumulative sum and one binary
    search take ~0.06 ms. Same distribution, other draws from the generator."""
    return _sample(logits, temperatures, generator, None, draw_by_cdf)


def _sample(logits, temperatures, generator, any_sampled, drawer) -> torch.Tensor:
    greedy = logits.argmax(dim=-1)
    if any_sampled is None:
        any_sampled = bool((temperatures > 0).any())
    if not any_sampled:
        return greedy
    t = temperatures.clamp_min(1e-5).unsqueeze(-1)
    return drawer(torch.softmax(logits / t, dim=-1), greedy, temperatures, generator)


def draw(
    probs: torch.Tensor,
    greedy: torch.Tensor,
    temperatures: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """probs (B, ..., V) -> a token drawn from each row where the request's temperature (B,) is
    > 0, else its ``greedy`` token (B, ...)."""
    drawn = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
    return _where_sampled(drawn, greedy, temperatures)


def draw_by_cdf(
    probs: torch.Tensor,
    greedy: torch.Tensor,
    temperatures: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``draw`` by inverse CDF: a uniform per row and a binary search of its cumulative sum."""
    cdf = probs.reshape(-1, probs.shape[-1]).cumsum(dim=-1)
    # a uniform in [0, total): the float sum may end a little off 1
    u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]
    drawn = torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[-1] - 1)
    return _where_sampled(drawn, greedy, temperatures)


def _where_sampled(drawn, greedy, temperatures) -> torch.Tensor:
    """The drawn token of each row whose request's temperature (B,) is > 0, else ``greedy``."""
    keep = temperatures.view(-1, *([1] * (greedy.dim() - 1))) > 0
    return torch.where(keep, drawn.view(greedy.shape), greedy)
