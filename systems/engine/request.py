"""A request as the engine sees it, with the timestamps the paper's TTFT breakdown needs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from systems.engine.prefill import PromptKey


@dataclass
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    ignore_eos: bool = True
    # SGLang's semantics: a token of stop_token_ids finishes like EOS (and, like EOS, not under
    # ignore_eos); a stop string finishes whatever ignore_eos says. The engine has no tokenizer:
    # ``stop`` is the server's matcher, called with the output ids after every new token, and
    # returns the stop string the decoded output now contains (or None).
    stop_token_ids: frozenset[int] = frozenset()
    stop: Callable[[list[int]], str | None] | None = None


class ReqStatus(str, Enum):
    WAITING = "waiting"
    HANDOFF = "handoff"  # admitted, its history on its way (asynchronous handoff)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    rid: str
    prompt_ids: Sequence[int]  # a list, or an array('q') from the server's body parser
    params: SamplingParams
    # on_output(req, new_token_ids, finished) runs on the engine thread after every step
    on_output: Callable[[Request, list[int], bool], None] | None = None
    status: ReqStatus = ReqStatus.WAITING
    slot: int = -1
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict | None = None
    # wall-clock (epoch) timestamps
    arrival_ts: float = field(default_factory=time.time)
    prefill_done_ts: float | None = None
    alloc_ts: float | None = None
    handoff_done_ts: float | None = None
    first_token_ts: float | None = None
    finish_ts: float | None = None
    prefill_s: float = 0.0
    token_ts: list[float] = field(default_factory=list)
    wait_reason: str = ""
    # set by Engine.abort; a waiting request so marked no longer counts against max_waiting
    aborted: bool = False
    # the prompt as the prefix store's key (systems/engine/prefill.py), built by Engine.submit
    # on the caller's thread rather than at admission on the engine thread
    prompt_key: PromptKey | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def seq_len(self) -> int:
        """Positions whose KV is (or is being) computed: prompt + outputs fed back so far."""
        return self.num_prompt_tokens + max(0, len(self.output_ids) - 1)

    def timing(self) -> dict:
        """Per-request breakdown reported to clients (Table A2 columns)."""
        ready = self.prefill_done_ts or self.arrival_ts
        return {
            "arrival_ts": self.arrival_ts,
            "prefill_s": self.prefill_s,
            "alloc_wait_s": (self.alloc_ts - ready) if self.alloc_ts else None,
            "handoff_s": (self.handoff_done_ts - self.alloc_ts)
            if self.handoff_done_ts and self.alloc_ts
            else None,
            "first_token_ts": self.first_token_ts,
            "finish_ts": self.finish_ts,
        }
