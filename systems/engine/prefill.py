"""Prefill side: prompts are prefilled once and their KV kept for admission to import.

This stands in for the prefill servers of a disaggregated deployment: with prepared prefixes
(one for GLM, 16 for DeepSeek in the paper) every request of a prefix reuses one prefill, and
admission copies that KV into the decode-side backend the way each policy receives it (the
handoff). Entries are kept in LRU order up to ``max_entries``. With ``DHS_PREFIX_CACHE`` set
(systems/disk_cache.py) a prompt's prefill is saved there and later servers load it instead of
prefilling again (every run of an interleaved protocol starts its own server).
"""

from __future__ import annotations

import functools
import hashlib
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from systems.disk_cache import PREFIX_ENV, load_or_compute
from systems.kv.base import PrefixKV
from systems.models.sparse_model import PrefillContext, SparseModel, prefill_chunk_size


@dataclass
class PrefillEntry:
    prefix: PrefixKV
    last_logits: torch.Tensor  # (V,) float32: the first output token is sampled from these
    last_logits_host: torch.Tensor  # the same on the host: admission samples there, no sync
    tail_hidden: torch.Tensor  # (L, D): target features of the last L positions (drafters)
    prefill_s: float
    # what a decoder derives from the prompt alone, once (a drafter's ring KV of the tail):
    # kept, and evicted, with the entry
    derived: dict = field(default_factory=dict)


def packed_ids(ids: Sequence[int]) -> array:
    """Token ids as an ``array('q')`` (int64), the array itself where it already is one;
    ValueError for ids that are not 64-bit integers."""
    if isinstance(ids, array) and ids.typecode == "q":
        return ids
    try:
        return array("q", ids)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"prompt token ids must be 64-bit integers: {e}") from None


class PromptKey:
    """A prompt as a dict key, hashed once. ``Engine.submit`` builds it on the caller's thread
    (``Request.prompt_key``), not at admission on the engine thread. The ids are kept packed
    (int64 bytes): a list and an ``array('q')`` of the same ids are one key, and the server's
    packed ids (systems/engine/body_parser.py) become a key without per-token work."""

    __slots__ = ("ids", "h")

    def __init__(self, ids: Sequence[int]):
        self.ids = packed_ids(ids).tobytes()
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
        self.num_prefills = 0  # computed here
        self.num_loads = 0  # loaded from DHS_PREFIX_CACHE

    def get(
        self, prompt_ids: Sequence[int], key: PromptKey | None = None
    ) -> tuple[PrefillEntry, bool]:
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

    def _prefill(self, prompt_ids: Sequence[int]) -> PrefillEntry:
        t0 = time.perf_counter()
        m = self.model
        q_chunk = prefill_chunk_size(
            m.cfg,
            len(prompt_ids),
            (1 << 28) if m.device.type == "cuda" else (1 << 24),  # fewer, larger chunks on GPU
        )
        # the cache keeps a tail of at least TAIL_ROWS hidden states, so systems whose drafters
        # keep different tails share one file of the prompt's KV
        tail = max(self.keep_hidden, TAIL_ROWS)
        compute_s = []

        def compute() -> dict:
            t = time.perf_counter()
            state = self._compute(prompt_ids, q_chunk, tail)
            compute_s.append(time.perf_counter() - t)
            return state

        state, loaded = load_or_compute(
            self._cache_key(prompt_ids, q_chunk, tail),
            compute,
            m.device,
            env=PREFIX_ENV,
            kind="prefix",
        )
        if loaded:
            self.num_loads += 1
        else:
            self.num_prefills += 1
        logits = state["last_logits"]
        return PrefillEntry(
            PrefixKV(int(state["num_tokens"]), state["kv"], state["index"]),
            logits,
            logits.float().cpu(),
            state["tail_hidden"][-self.keep_hidden :].clone(),
            # the prefill's own time (a save to the cache after it is not part of it), or the load's
            time.perf_counter() - t0 if loaded else compute_s[0],
        )

    def _compute(self, prompt_ids: Sequence[int], q_chunk: int, tail: int) -> dict:
        m = self.model
        T = len(prompt_ids)
        dev = m.device
        ctx = PrefillContext(m.cfg, T, dev, m.dtype)
        tokens = torch.tensor([list(prompt_ids)], device=dev)  # a list or an array('q')
        positions = torch.arange(T, device=dev).unsqueeze(0)
        logits, hidden = m(tokens, positions, ctx, q_chunk=q_chunk, last_only=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return {
            "num_tokens": T,
            "kv": ctx.kv,
            "index": ctx.index,
            "last_logits": logits[0, -1],
            "tail_hidden": hidden[0, -tail:].clone(),
        }

    def _cache_key(self, prompt_ids: Sequence[int], q_chunk: int, tail: int) -> str:
        """Everything a prefill's bytes depend on: the prompt, the model (its config fixes the
        drawn weights), the kernels chosen and their code, the device, torch's, CUDA's and
        Triton's versions."""
        m = self.model
        dev = m.device
        gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else ""
        prompt = hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()
        return repr(
            (
                _code_digest(),
                repr(m.cfg),
                m.dtype,
                m.attention_impl,
                m.topk_impl,
                dev.type,
                gpu,
                torch.__version__,
                torch.version.cuda,
                _triton_version(),
                tail,
                q_chunk,
                prompt,
            )
        )


# hidden states kept per cached prompt at least (a few MB): every drafter window up to it
# reads the same file
TAIL_ROWS = 4096


def _triton_version() -> str:
    try:
        import triton

        return str(triton.__version__)
    except Exception:  # no Triton: the PyTorch references compute the prefill
        return ""


@functools.cache
def _code_digest() -> str:
    """The source of what computes a prefill (the model, its kernels, this file): a prefix
    cached by other code is computed anew."""
    root = Path(__file__).resolve().parents[1]
    files = sorted([*root.glob("models/*.py"), *root.glob("kernels/*.py"), Path(__file__)])
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()
