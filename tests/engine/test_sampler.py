"""The host sampler (a request's first token at admission) against the device one's contract:
argmax at temperature 0, the softmax distribution otherwise."""

import pytest
import torch

from systems.engine.sampler import sample, sample_on_host


def test_temperature_zero_rows_are_argmax_and_the_generator_is_untouched():
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(7)
    state = g.get_state()
    got = sample_on_host(logits, torch.zeros(5), g)
    assert torch.equal(got, logits.argmax(-1)) and torch.equal(g.get_state(), state)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_draws_follow_the_softmax_like_the_device_sampler(temperature):
    """40,000 draws over a 7-token vocabulary with two impossible tokens: each token's frequency
    within 1.5 % of its probability, as torch.multinomial's (``sample``) is; never an impossible
    token, including the last one (a uniform at the top of a float sum below 1)."""
    logits = torch.tensor([[2.0, 0.5, -float("inf"), 1.0, -1.0, 0.0, -float("inf")]])
    n = 40_000
    rows = logits.expand(n, -1).contiguous()
    t = torch.full((n,), temperature)
    want = torch.softmax(logits[0] / temperature, -1)
    for fn in (sample_on_host, sample):
        got = fn(rows, t, torch.Generator().manual_seed(1))
        freq = torch.bincount(got, minlength=7).float() / n
        assert freq[2] == 0 and freq[6] == 0, fn.__name__
        assert torch.allclose(freq, want, atol=0.015), (fn.__name__, freq, want)


def test_mixed_rows_and_seeded_draws_repeat():
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(3))
    t = torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0, 0.0])
    a = sample_on_host(logits, t, torch.Generator().manual_seed(5))
    b = sample_on_host(logits, t, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    greedy = logits.argmax(-1)
    assert torch.equal(a[t == 0], greedy[t == 0])
