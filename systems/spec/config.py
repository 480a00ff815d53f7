"""``system.speculation``: the speculative decoder's knobs as one frozen dataclass.

``resolved`` fills the derived values once (``systems.engine.config.resolve``): the calibrated
acceptance's emitted tokens per round from the paper's table, and DSpark's confidence source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DRAFTER_KINDS = ("dflash2", "dspark")
ACCEPTANCE_MODES = ("exact", "calibrated")
CONFIDENCE_SOURCES = ("auto", "drafter", "calibrated")


@dataclass(frozen=True)
class SpeculationConfig:
    drafter: str = "dflash2"  # dflash2: a parallel block of K-1 proposals; dspark: sequential
    block_size: int = 4  # K: target queries per round, anchor included (DSpark: the largest K_r)
    k_max: int = 8  # the widest block the KV backend is sized for
    window: int = 2048  # W: the drafter reads at most W prior positions (ring, eq. 9)
    draft_layers: int = 2
    draft_dim: int = 64
    acceptance: str = "exact"  # exact | calibrated (accepted length matched to Fig. 7a)
    # calibrated mode's emitted tokens per round; null: the paper's value for the block size
    calibrated_emitted_per_round: float | None = None
    # DSpark's prefix choice reads the drafter's confidences or the calibrated acceptance;
    # auto: the calibrated acceptance under calibrated mode
    scheduler_confidence: str = "auto"
    cost_base: float = 1.0  # DSpark's engine cost model: cost(K) = cost_base + cost_per_query * K
    cost_per_query: float = 0.15

    def __post_init__(self) -> None:
        def bad(f: str, msg: str) -> ValueError:
            return ValueError(f"system.speculation.{f}: {msg}")

        if self.drafter not in DRAFTER_KINDS:
            raise bad("drafter", f"must be one of {DRAFTER_KINDS}, got {self.drafter!r}")
        if not 2 <= int(self.block_size) <= int(self.k_max):
            raise bad("block_size", f"{self.block_size} must be in [2, k_max={self.k_max}]")
        for f in ("window", "draft_layers", "draft_dim"):
            if int(getattr(self, f)) < 1:
                raise bad(f, f"must be >= 1, got {getattr(self, f)}")
        if self.acceptance not in ACCEPTANCE_MODES:
            raise bad("acceptance", f"must be one of {ACCEPTANCE_MODES}, got {self.acceptance!r}")
        if self.scheduler_confidence not in CONFIDENCE_SOURCES:
            raise bad(
                "scheduler_confidence",
                f"must be one of {CONFIDENCE_SOURCES}, got {self.scheduler_confidence!r}",
            )
        e = self.calibrated_emitted_per_round
        if e is not None and not 1.0 <= float(e) <= float(self.block_size):
            raise bad(
                "calibrated_emitted_per_round",
                f"must be in [1, block_size={self.block_size}], got {e}",
            )

    def resolved(self, max_context_len: int) -> SpeculationConfig:
        from systems.spec.acceptance import PAPER_EMITTED_PER_ROUND

        emitted = self.calibrated_emitted_per_round
        if emitted is None:
            emitted = PAPER_EMITTED_PER_ROUND.get(int(self.block_size), 2.88)
        conf = self.scheduler_confidence
        if conf == "auto":
            conf = "calibrated" if self.acceptance == "calibrated" else "drafter"
        # the drafter never reads more positions than a request can hold
        return dataclasses.replace(
            self,
            calibrated_emitted_per_round=float(emitted),
            scheduler_confidence=conf,
            window=min(int(self.window), int(max_context_len)),
        )
