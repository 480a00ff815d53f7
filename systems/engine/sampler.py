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
    greedy = logits.argmax(dim=-1)
    if any_sampled is None:
        any_sampled = bool((temperatures > 0).any())
    if not any_sampled:
        return greedy
    t = temperatures.clamp_min(1e-5).unsqueeze(-1)
    return draw(torch.softmax(logits / t, dim=-1), greedy, temperatures, generator)


def draw(
    probs: torch.Tensor,
    greedy: torch.Tensor,
    temperatures: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """probs (B, ..., V) -> a token drawn from each row where the request's temperature (B,) is
    > 0, else its ``greedy`` token (B, ...)."""
    drawn = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
    keep = temperatures.view(-1, *([1] * (greedy.dim() - 1))) > 0
    return torch.where(keep, drawn.view(greedy.shape), greedy)


def sample_on_host(
    logits: torch.Tensor, temperatures: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``sample`` for CPU tensors by inverse CDF: logits (B, V) float32, temperatures (B,) ->
    token ids (B,). Why: admission samples each request's first token on the engine thread
    from the prefill's host logits, where ``torch.multinomial`` over a 32K vocabulary takes
    ~0.6 ms a row (a request's first token cost ~2 ms of the engine thread's CPU in fig5_h200);
    a cumulative sum and one binary search take ~0.06 ms. Same distribution as ``sample``,
    other draws from the generator; temperature 0 is argmax."""
    greedy = logits.argmax(dim=-1)
    hot = temperatures > 0
    if not bool(hot.any()):
        return greedy
    t = temperatures.clamp_min(1e-5).unsqueeze(-1)
    cdf = torch.softmax(logits / t, dim=-1).cumsum(dim=-1)
    # a uniform in [0, total): the float sum may end a little off 1
    u = torch.rand(logits.shape[0], 1, generator=generator) * cdf[:, -1:]
    drawn = torch.searchsorted(cdf, u, right=True).clamp_max(logits.shape[-1] - 1).squeeze(-1)
    return torch.where(hot, drawn, greedy)
