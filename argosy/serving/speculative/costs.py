"""What a verify pass costs relative to a plain decode step, learned engine-wide.

On a GPU at batch 1 a verify pass of k draft tokens costs about one plain step; on a CPU
(compute-bound) or at large batch each draft token adds to it. `StepCosts` keeps moving
averages of the plain step's seconds and of the relative cost of one draft token,
`c = (verify_s / plain_s - 1) / k`, over every request an engine serves, so a new request
starts from the engine's experience instead of learning costs again. Updates are plain
float writes (safe enough from several threads: a lost update only delays the average).

`ForwardCosts` is the batch loop's view: the seconds of one batched forward pass as a
function of the tokens in it (rows x (1 + draft width)), a moving average per token count,
interpolated between counts it has seen. A batch of B rows verifying k draft tokens each
feeds B(k+1) tokens, so the marginal cost of drafting grows with B: small where decoding
is memory-bound (the weights are read once however many tokens), large where it is
compute-bound (a CPU, or a GPU at large batch). Beyond the largest count seen it
extrapolates with a deliberately optimistic slope, so the policy tries a wider pass once
and then knows; below the smallest it scales down in proportion (plain steps look cheap,
which is the safe side).
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


DEFAULT_EXTRA_TOKEN_COST = 0.25
"""Before a wider pass was seen: each token past the widest seen adds this fraction of
that pass's per-token time."""


class ForwardCosts:
    """Seconds of a batched forward pass by the number of tokens it feeds, learned online."""

    def __init__(self, extra_token_cost: float = DEFAULT_EXTRA_TOKEN_COST) -> None:
        self.extra_token_cost = extra_token_cost
        self.seconds_by_tokens: dict[int, float] = {}

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Learn from one forward pass that fed `num_tokens` tokens."""
        if num_tokens < 1 or seconds <= 0:
            return
        old = self.seconds_by_tokens.get(num_tokens)
        self.seconds_by_tokens[num_tokens] = _ema(old, seconds)

    def seconds(self, num_tokens: int) -> float | None:
        """Estimated seconds of a pass feeding `num_tokens` tokens (None: nothing seen)."""
        seen = sorted(self.seconds_by_tokens)
        if not seen:
            return None
        if num_tokens in self.seconds_by_tokens:
            return self.seconds_by_tokens[num_tokens]
        lower = [n for n in seen if n < num_tokens]
        upper = [n for n in seen if n > num_tokens]
        if not lower:  # below everything seen: proportionally cheaper
            return self.seconds_by_tokens[upper[0]] * num_tokens / upper[0]
        if upper:
            lo, hi = lower[-1], upper[0]
            t_lo, t_hi = self.seconds_by_tokens[lo], self.seconds_by_tokens[hi]
            return t_lo + (t_hi - t_lo) * (num_tokens - lo) / (hi - lo)
        top = lower[-1]
        per_token = self.seconds_by_tokens[top] / top
        return self.seconds_by_tokens[top] + self.extra_token_cost * per_token * (num_tokens - top)
