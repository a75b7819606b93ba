"""How many draft tokens the rows of a batch verify together: a pure decision plus its state.

At batch B every row feeds `1 + width` tokens to one forward pass (rows with shorter drafts
are padded), so the step costs `T(B * (1 + width))` whatever each row drafted. An adaptive
row i with acceptance a_i and an offered draft of d_i tokens then yields
`E(a_i, min(width, d_i))` tokens (`adaptive.expected_tokens`); a fixed row (a proposer that
does not adapt, such as `ngram`) is verified whole, which sets a floor on the width.
`draft_width` picks the width in [floor, longest offer] with the best expected tokens per
second, and keeps the floor (for all-adaptive batches: no speculation) unless the best wins
by `min_gain`. With few rows or a memory-bound pass `T` barely grows with the width and
copy-heavy rows draft long; with many rows on a compute-bound device the width falls to 0.

    policy = BatchDraftPolicy()
    width = policy.width(offers)           # before the pass
    policy.observe(rows * (1 + width), s)   # after it
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from argosy.serving.speculative.adaptive import expected_tokens
from argosy.serving.speculative.base import DraftOffer
from argosy.serving.speculative.costs import ForwardCosts

MIN_GAIN = 1.05
"""A wider pass must promise this many times the tokens per second of the floor."""


def draft_width(
    offers: Sequence[DraftOffer],
    seconds: Callable[[int], float | None],
    min_gain: float = MIN_GAIN,
) -> int:
    """The draft width with the best expected tokens per second (the floor unless it wins)."""
    floor = max((len(o.tokens) for o in offers if not o.adaptive), default=0)
    top = max((len(o.tokens) for o in offers), default=0)
    if top <= floor:
        return floor
    best, best_rate = floor, None
    for width in range(floor, top + 1):
        rate = batch_rate(offers, width, seconds)
        if rate is None:
            return floor  # nothing measured yet: run the floor and learn its cost
        if best_rate is None:
            best_rate = rate * min_gain
        elif rate > best_rate:
            best, best_rate = width, rate
    return best


def batch_rate(
    offers: Sequence[DraftOffer], width: int, seconds: Callable[[int], float | None]
) -> float | None:
    """Expected tokens per second of one pass at `width` (None when its cost is unknown)."""
    elapsed = seconds(len(offers) * (1 + width))
    if elapsed is None or elapsed <= 0:
        return None
    tokens = sum(
        expected_tokens(o.acceptance, min(width, len(o.tokens)) if o.adaptive else len(o.tokens))
        for o in offers
    )
    return tokens / elapsed


class BatchDraftPolicy:
    """`draft_width` over forward costs measured while serving."""

    def __init__(self, costs: ForwardCosts | None = None, min_gain: float = MIN_GAIN) -> None:
        self.costs = costs if costs is not None else ForwardCosts()
        self.min_gain = min_gain

    def width(self, offers: Sequence[DraftOffer]) -> int:
        """The draft width for this step."""
        return draft_width(offers, self.costs.seconds, self.min_gain)

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Learn from a batched pass that fed `num_tokens` tokens."""
        self.costs.observe(num_tokens, seconds)


class VerifyWholeDrafts:
    """No batch-level sizing: every offered draft is verified in full."""

    def width(self, offers: Sequence[DraftOffer]) -> int:
        """The longest offer."""
        return max((len(o.tokens) for o in offers), default=0)

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Nothing to learn."""
