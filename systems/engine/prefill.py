"""Prefill side: prompts are prefilled once and their KV kept for admission to import.

This stands in for the prefill servers of a disaggregated deployment: with prepared prefixes
(one for GLM, 16 for DeepSeek in the paper) every request of a prefix reuses one prefill, and
admission copies that KV into the decode-side backend the way each policy receives it (the
handoff). Entries are kept in LRU order up to ``max_entries``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from systems.kv.base import PrefixKV
from systems.models.sparse_model import PrefillContext, SparseModel, prefill_chunk_size


@dataclass
class PrefillEntry:
    prefix: PrefixKV
    last_logits: torch.Tensor  # (V,) float32: the first output token is sampled from these
    last_logits_host: torch.Tensor  # the same on the host: admission samples there, no sync
    tail_hidden: torch.Tensor  # (L, D): target features of the last L positions (drafters)
    prefill_s: float


class PromptKey:
    """A prompt as a dict key, hashed once. ``Engine.submit`` builds it on the caller's thread
    (``Request.prompt_key``): a 50K-token prompt's tuple and hash take ~0.4 ms, which would
    otherwise run on the engine thread at admission."""

    __slots__ = ("ids", "h")

    def __init__(self, ids: list[int]):
        self.ids = tuple(ids)
        self.h = hash(self.ids)

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other) -> bool:
        return other is self or (
            isinstance(other, PromptKey) and self.h == other.h and self.ids == other.ids
        )


class PrefixStore:
    def __init__(self, model: SparseModel, max_entries: int = 16, keep_hidden: int = 1):
        self.model = model
        self.keep_hidden = keep_hidden
        self.max_entries = max_entries
        self._entries: OrderedDict[PromptKey, PrefillEntry] = OrderedDict()
        self.num_prefills = 0

    def get(self, prompt_ids: list[int], key: PromptKey | None = None) -> tuple[PrefillEntry, bool]:
        """Returns (entry, computed_now). ``key``: the prompt's key where the caller built it
        (``Request.prompt_key``)."""
        key = key or PromptKey(prompt_ids)
        # one lookup (a hit compares the whole prompt once): pop, then reinsert at the end
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._entries[key] = entry
            return entry, False
        entry = self._prefill(prompt_ids)
        self._entries[key] = entry
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return entry, True

    def _prefill(self, prompt_ids: list[int]) -> PrefillEntry:
        m = self.model
        t0 = time.perf_counter()
        T = len(prompt_ids)
        dev = m.device
        ctx = PrefillContext(m.cfg, T, dev, m.dtype)
        tokens = torch.tensor([prompt_ids], device=dev)
        positions = torch.arange(T, device=dev).unsqueeze(0)
        budget = (1 << 28) if dev.type == "cuda" else (1 << 24)  # fewer, larger chunks on GPU
        logits, hidden = m(
            tokens, positions, ctx, q_chunk=prefill_chunk_size(m.cfg, T, budget), last_only=True
        )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        self.num_prefills += 1
        return PrefillEntry(
            PrefixKV(T, ctx.kv, ctx.index),
            logits[0, -1],
            logits[0, -1].float().cpu(),
            hidden[0, -self.keep_hidden :].clone(),
            time.perf_counter() - t0,
        )
