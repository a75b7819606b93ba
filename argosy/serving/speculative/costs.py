"""What a verify pass costs relative to a plain decode step, learned engine-wide.

On a GPU at batch 1 a verify pass of k draft tokens costs about one plain step; on a CPU
(compute-bound) or at large batch each draft token adds to it. `StepCosts` keeps moving
averages of the plain step's seconds and of the relative cost of one draft token,
`c = (verify_s / plain_s - 1) / k`, over every request an engine serves, so a new request
starts from the engine's experience instead of learning costs again. Updates are plain
float writes (safe enough from several threads: a lost update only delays the average).
"""

from __future__ import annotations

_EMA = 0.2
DEFAULT_DRAFT_TOKEN_COST = 0.25
"""Relative cost of one draft token before anything was measured (conservative for CPUs)."""


class StepCosts:
    """Moving averages of the plain step time and the relative cost of a draft token."""

    def __init__(self, default_draft_token_cost: float = DEFAULT_DRAFT_TOKEN_COST) -> None:
        self.plain_s: float | None = None
        self.draft_token_cost = default_draft_token_cost
        self.samples = 0

    def observe(self, num_drafted: int, elapsed_s: float) -> None:
        """Learn from one step: a plain step (no draft) or a verify pass of `num_drafted`."""
        if elapsed_s <= 0:
            return
        if num_drafted == 0:
            self.plain_s = _ema(self.plain_s, elapsed_s)
            return
        if self.plain_s is None:
            return
        relative = (elapsed_s / self.plain_s - 1.0) / num_drafted
        self.draft_token_cost = _ema(self.draft_token_cost, min(2.0, max(0.0, relative)))
        self.samples += 1


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new
