"""Shared builders for tests: engines composed through the real Hydra configs."""

from __future__ import annotations

import json

import torch

from systems.engine.config import compose, resolve_engine_config
from systems.engine.engine import Engine
from systems.engine.request import Request, SamplingParams

GOLDEN_PROMPT_LENS = (5, 23, 40, 77, 130)


def make_engine(*overrides: str) -> Engine:
    """An engine on CPU. The start-up graph warm-up is off unless an override names it: an
    emulated capture costs a forward pass and saves nothing, and the warm-up has its own tests
    (tests/engine/test_cuda_graph.py)."""
    if not any(o.lstrip("+~").startswith("engine.cuda_graph_warmup") for o in overrides):
        overrides = ("engine.cuda_graph_warmup=false", *overrides)
    cfg = compose(["device=cpu", *overrides])
    return Engine(resolve_engine_config(cfg))


def golden_prompts(vocab: int = 512, seed: int = 1234) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in GOLDEN_PROMPT_LENS]


def run_greedy(engine: Engine, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    reqs = [
        Request(engine.new_rid(), p, SamplingParams(max_new_tokens=max_new_tokens)) for p in prompts
    ]
    for r in reqs:
        engine.submit(r)
    engine.run_until_idle()
    return [r.output_ids for r in reqs]


async def read_sse(resp) -> list:
    """The events of one streamed response: parsed JSON chunks, then "[DONE]" if it came."""
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[6:]
        if payload == "[DONE]":
            events.append("[DONE]")
            break
        events.append(json.loads(payload))
    return events


# a model small enough to build in milliseconds (weight and prefix cache tests)
SMALL_MODEL = dict(
    hidden_size=32,
    intermediate_size=48,
    num_heads=2,
    kv_dim=16,
    kv_rope_dim=8,
    index_dim=8,
    index_topk=8,
    vocab_size=40,
    max_context_len=64,
)


class SlowCopy:
    """Stands in for a CUDA event after copies on a side stream (a handoff's, a background
    reclaim's): complete after ``polls`` queries; ``synchronize`` completes it and says it was
    waited for."""

    def __init__(self, polls: int):
        self.left = polls
        self.waited = False

    def query(self) -> bool:
        self.left -= 1
        return self.left < 0

    def synchronize(self) -> None:
        self.left, self.waited = -1, True
