"""Adaptive speculation (`auto`): n-gram drafts, sized by a cost model, off when they lose.

Per request it estimates the per-token acceptance `a` of the drafts (a decayed geometric
estimate: accepted tokens over accepted tokens plus rejections, from a weak prior worth two
observations: the engine's running acceptance of `auto` drafts, `ProposerContext.acceptance`,
or 0.5 before the engine has drafted anything). A request starts with a short probe unless
the engine's acceptance is at least `warm_acceptance` (0.8: copy-heavy traffic), in which
case it drafts what its cost model allows at once.
With draft length k a verify pass yields `E(k) = (1 - a^(k+1)) / (1 - a)` tokens and costs
`1 + c*k` plain steps, where `c` is the relative cost of a draft token that the engine
measures across requests (`StepCosts`, passed in each `StepRecord`). It drafts the k that
maximizes `E(k) / (1 + c*k)` and stops drafting when even the best k gains less than
`min_gain` (5%). A stop lasts a back-off of plain steps that doubles on each further loss
(8 to 128 steps); after it one short draft probes again. One rejected probe on open-ended
text is therefore enough to turn speculation off; on copy-heavy text acceptance stays high
and the draft grows to `max_draft_tokens`.

At batch > 1 the batch loop calls `offer` instead, and the per-request switch above (probe,
cost model, back-off) does not apply: its cost model is a batch-1 one (what a draft token
adds to this request's own pass), while in a batch every row's pass is padded to one width,
so a row's draft costs nothing unless the batch policy (`batch_policy.py`) widens the pass
for it. `offer` hands over the whole n-gram draft with this request's acceptance estimate
(at most `NEW_ROW_ACCEPTANCE` before its first verified draft), and the policy picks the
width from every row's acceptance and the measured cost of a wider pass at the current
batch size (at full batch on a CPU: none). Holding drafts back
at batch only lost tokens: a cold request (prior 0.5) probed with 2 tokens and, after one
partly rejected probe, sat out 8 steps of a 32-token copy-heavy answer that `ngram` drafted
whole. Verify passes in a batch still update the estimate, and the back-off state carries
on if the request runs alone again.
"""

from __future__ import annotations

from collections.abc import Sequence

from argosy.serving.speculative.base import (
    NEW_ROW_ACCEPTANCE,
    DraftOffer,
    ProposerContext,
    StepRecord,
)
from argosy.serving.speculative.costs import DEFAULT_DRAFT_TOKEN_COST
from argosy.serving.speculative.ngram import NgramProposer

_DECAY = 0.8
"""Weight kept by older verify passes at each new one (recent text matters most)."""
_PRIOR_WEIGHT = 2.0
"""Observations the starting acceptance is worth."""


class AdaptiveProposer:
    """Wraps an n-gram proposer with a per-request cost/benefit switch."""

    def __init__(
        self,
        max_draft_tokens: int = 8,
        min_gain: float = 1.05,
        min_backoff_steps: int = 8,
        max_backoff_steps: int = 128,
        probe_tokens: int = 2,
        context: ProposerContext | None = None,
        warm_acceptance: float = 0.8,
    ) -> None:
        self.inner = NgramProposer(max_draft_tokens=max_draft_tokens)
        self.max_draft_tokens = max_draft_tokens
        self.min_gain = min_gain
        self.min_backoff_steps = min_backoff_steps
        self.max_backoff_steps = max_backoff_steps
        self.probe_tokens = probe_tokens
        prior = context.acceptance if context is not None else None
        start = 0.5 if prior is None else min(0.95, max(0.05, prior))
        self.accepted_weight = _PRIOR_WEIGHT * start  # prior: two observations at the
        self.rejected_weight = _PRIOR_WEIGHT * (1 - start)  # engine's acceptance (or 0.5)
        self.draft_token_cost = DEFAULT_DRAFT_TOKEN_COST
        self.off_steps = 0
        self.backoff = min_backoff_steps
        self.probing = prior is None or prior < warm_acceptance
        self.verified = False
        """Whether a draft of this request was verified (before: `offer` claims at most
        `NEW_ROW_ACCEPTANCE`)."""

    @property
    def acceptance(self) -> float:
        """Estimated chance that the next draft token is accepted, given the ones before."""
        return self.accepted_weight / (self.accepted_weight + self.rejected_weight)

    @property
    def draft_len(self) -> int:
        """The draft length with the best expected gain (0: speculation does not pay)."""
        if self.probing:
            return min(self.probe_tokens, self.max_draft_tokens)
        best_k, best_gain = 0, self.min_gain
        for k in range(1, self.max_draft_tokens + 1):
            gain = expected_tokens(self.acceptance, k) / (1.0 + self.draft_token_cost * k)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k

    def propose(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Draft, unless speculation is backed off or does not pay."""
        length = self._gate()
        return self.inner.propose(context, min(max_tokens, length)) if length else []

    def offer(self, context: Sequence[int], max_tokens: int) -> DraftOffer:
        """At batch > 1: the full n-gram draft with this request's acceptance estimate; the
        batch policy decides how much of it is verified (no probe, no back-off here)."""
        draft = self.inner.propose(context, max_tokens)
        claim = self.acceptance if self.verified else min(self.acceptance, NEW_ROW_ACCEPTANCE)
        return DraftOffer(tuple(draft), claim, adaptive=True)

    def _gate(self) -> int:
        """The draft length this request's own cost model allows now (0 while backed off)."""
        if self.off_steps > 0:
            self.off_steps -= 1
            self.probing = self.off_steps == 0
            return 0
        length = self.draft_len
        if length == 0:
            self._back_off()
        return length

    def observe(self, step: StepRecord) -> None:
        """Update acceptance and costs after a step."""
        if step.draft_token_cost is not None:
            self.draft_token_cost = step.draft_token_cost
        if step.num_drafted == 0:
            return
        self.probing = False
        self.verified = True
        rejected = 1.0 if step.num_accepted < step.num_drafted else 0.0
        self.accepted_weight = _DECAY * self.accepted_weight + step.num_accepted
        self.rejected_weight = _DECAY * self.rejected_weight + rejected
        if self.draft_len == 0:
            self._back_off()
        else:
            self.backoff = self.min_backoff_steps

    def wins(self) -> bool:
        """Whether speculation is expected to beat plain decoding now."""
        return not self.probing and self.off_steps == 0 and self.draft_len > 0

    def _back_off(self) -> None:
        self.off_steps = self.backoff
        self.backoff = min(self.backoff * 2, self.max_backoff_steps)
        self.probing = False


def expected_tokens(acceptance: float, draft_len: int) -> float:
    """Tokens one verify pass yields: accepted draft prefix plus the target's own token."""
    if acceptance >= 1.0:
        return draft_len + 1.0
    return (1.0 - acceptance ** (draft_len + 1)) / (1.0 - acceptance)
