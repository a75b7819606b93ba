"""What a verify pass costs relative to a plain decode step, learned engine-wide.

On a GPU at batch 1 a verify pass of k draft tokens costs about one plain step; on a CPU
(compute-bound) or at large batch each draft token adds to it. `StepCosts` keeps the
seconds of a request's own (batch-1) steps by the tokens they feed (a `ForwardCosts` over
every request an engine serves, so a new request starts from the engine's experience) and
derives the relative cost of one draft token from a full draft's pass,
`c = (T(1 + K) / T(1) - 1) / K` with K = `max_draft_tokens`. Not from each pass's own ratio:
that divides the timing noise of a short pass by its k (one slow 2-token pass on a shared
CPU reads as c = 0.5), and a short pass is not a cheaper one in proportion (oneDNN runs a
3-token pass slower than a 9-token one here), so the per-pass estimate climbed to 0.6
while a full draft cost c = 0.06-0.1, and `auto` stopped drafting on copy-heavy text.
Updates are plain dict writes (safe enough from several threads: a lost update only
delays the average).

`ForwardCosts` is the batch loop's view: the seconds of one batched forward pass as a
function of the tokens in it (rows x (1 + draft width)), a moving average per token count,
interpolated between counts it has seen. A batch of B rows verifying k draft tokens each
feeds B(k+1) tokens, so the marginal cost of drafting grows with B: small where decoding
is memory-bound (the weights are read once however many tokens), large where it is
compute-bound (a CPU, or a GPU at large batch). Beyond the largest count seen it
extrapolates with a deliberately optimistic slope, so the policy tries a wider pass once
and then knows; below the smallest it scales down in proportion (plain steps look cheap,
which is the safe side). A reading not refreshed for `max_age` passes is set aside while a
fresher, smaller one exists: the estimate for that count falls back to the optimistic
extrapolation, so the policy re-probes the width and one noisy slow pass does not rule a
width out for good.

`AcceptanceTracker` is the engine's running acceptance per proposer (a decayed estimate over
every request's verify passes), the prior a new request's adaptive proposer starts from.
"""

from __future__ import annotations

_EMA = 0.2
DEFAULT_DRAFT_TOKEN_COST = 0.25
"""Relative cost of one draft token before anything was measured (conservative for CPUs)."""


class StepCosts:
    """Seconds of batch-1 steps by the tokens they feed; the relative cost of a draft token."""

    def __init__(
        self,
        default_draft_token_cost: float = DEFAULT_DRAFT_TOKEN_COST,
        max_draft_tokens: int = 8,
    ) -> None:
        self.default_draft_token_cost = default_draft_token_cost
        self.max_draft_tokens = max_draft_tokens
        self.forward = ForwardCosts(extra_token_cost=default_draft_token_cost)
        """Seconds of a solo step by tokens fed (1: a plain step; 1 + k: a verify pass)."""
        self.samples = 0

    @property
    def plain_s(self) -> float | None:
        """Seconds of a plain step (None before one was seen)."""
        return self.forward.seconds_by_tokens.get(1)

    @property
    def draft_token_cost(self) -> float:
        """What one draft token adds to a pass, relative to a plain step, averaged over a full
        draft (beyond the widest pass seen: the optimistic extrapolation of `ForwardCosts`,
        which is the default cost when only plain steps were seen)."""
        plain = self.plain_s
        if plain is None or not self.samples:
            return self.default_draft_token_cost
        full = self.forward.seconds(1 + self.max_draft_tokens)
        assert full is not None  # a plain step was seen
        return min(2.0, max(0.0, (full / plain - 1.0) / self.max_draft_tokens))

    def observe(self, num_drafted: int, elapsed_s: float) -> None:
        """Learn from one step: a plain step (no draft) or a verify pass of `num_drafted`."""
        if elapsed_s <= 0:
            return
        self.forward.observe(1 + num_drafted, elapsed_s)
        self.samples += num_drafted > 0


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new


DEFAULT_EXTRA_TOKEN_COST = 0.25
"""Before a wider pass was seen: each token past the widest seen adds this fraction of
that pass's per-token time."""


DEFAULT_MAX_AGE = 16
"""Passes after which an unrefreshed reading gives way to a fresher, smaller one."""


class ForwardCosts:
    """Seconds of a batched forward pass by the number of tokens it feeds, learned online."""

    def __init__(
        self, extra_token_cost: float = DEFAULT_EXTRA_TOKEN_COST, max_age: int = DEFAULT_MAX_AGE
    ) -> None:
        self.extra_token_cost = extra_token_cost
        self.max_age = max_age
        self.seconds_by_tokens: dict[int, float] = {}
        self.seen_at: dict[int, int] = {}  # token count -> pass number of its latest reading
        self.passes = 0

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Learn from one forward pass that fed `num_tokens` tokens."""
        if num_tokens < 1 or seconds <= 0:
            return
        self.passes += 1
        stale = self.passes - self.seen_at.get(num_tokens, self.passes) > self.max_age
        old = None if stale else self.seconds_by_tokens.get(num_tokens)
        self.seconds_by_tokens[num_tokens] = _ema(old, seconds)
        self.seen_at[num_tokens] = self.passes

    def seconds(self, num_tokens: int) -> float | None:
        """Estimated seconds of a pass feeding `num_tokens` tokens (None: nothing seen)."""
        table = self._current()
        seen = sorted(table)
        if not seen:
            return None
        if num_tokens in table:
            return table[num_tokens]
        lower = [n for n in seen if n < num_tokens]
        upper = [n for n in seen if n > num_tokens]
        if not lower:  # below everything seen: proportionally cheaper
            return table[upper[0]] * num_tokens / upper[0]
        if upper:
            lo, hi = lower[-1], upper[0]
            return table[lo] + (table[hi] - table[lo]) * (num_tokens - lo) / (hi - lo)
        top = lower[-1]
        per_token = table[top] / top
        return table[top] + self.extra_token_cost * per_token * (num_tokens - top)

    def _current(self) -> dict[int, float]:
        """The readings in use: a stale one only while no fresher reading is smaller."""
        fresh = [n for n, at in self.seen_at.items() if self.passes - at <= self.max_age]
        smallest_fresh = min(fresh, default=None)
        return {
            n: t
            for n, t in self.seconds_by_tokens.items()
            if n in fresh or smallest_fresh is None or n < smallest_fresh
        }


_ACCEPTANCE_DECAY = 0.8
"""Weight kept by the engine's older verify passes at each new one (the last few passes
count: after copy-heavy traffic a few rejected open-ended passes bring it down)."""


class AcceptanceTracker:
    """The engine's running per-token acceptance for each proposer, over all requests."""

    def __init__(self) -> None:
        self.weights: dict[str, tuple[float, float]] = {}  # key -> (accepted, rejections)

    def observe(self, key: str, drafted: int, accepted: int) -> None:
        """Learn from one verify pass of `drafted` tokens that kept `accepted`."""
        if not drafted or not key:
            return
        kept, rejected = self.weights.get(key, (0.0, 0.0))
        rejection = 1.0 if accepted < drafted else 0.0
        decay = _ACCEPTANCE_DECAY
        self.weights[key] = (decay * kept + accepted, decay * rejected + rejection)

    def acceptance(self, key: str) -> float | None:
        """The running estimate (None before the proposer drafted anything here)."""
        kept, rejected = self.weights.get(key, (0.0, 0.0))
        total = kept + rejected
        return kept / total if total > 0 else None
