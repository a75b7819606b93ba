"""Adaptive speculation (`auto`): n-gram drafts, kept only while they pay, per request.

It measures, for this request, the seconds of a plain decode step and of a verify pass and
the tokens a verify pass yields, as moving averages. Speculation pays when
`tokens_per_verify / verify_s > 1 / plain_s`. When it loses, drafting stops for a back-off
that doubles on each further loss (up to `max_backoff_steps`), then is probed again. The
draft length starts at 2 and follows acceptance: a fully accepted draft doubles it, a draft
less than half accepted halves it. With no recent plain step to compare against, one plain
step is taken every `probe_interval` steps so the comparison stays current.
"""

from __future__ import annotations

from collections.abc import Sequence

from argosy.serving.speculative.base import StepRecord
from argosy.serving.speculative.ngram import NgramProposer

_EMA = 0.3


class AdaptiveProposer:
    """Wraps an n-gram proposer with a per-request cost/benefit switch."""

    def __init__(
        self,
        max_draft_tokens: int = 8,
        min_samples: int = 2,
        max_backoff_steps: int = 64,
        probe_interval: int = 32,
    ) -> None:
        self.inner = NgramProposer(max_draft_tokens=max_draft_tokens)
        self.max_draft_tokens = max_draft_tokens
        self.min_samples = min_samples
        self.max_backoff_steps = max_backoff_steps
        self.probe_interval = probe_interval
        self.draft_len = min(2, max_draft_tokens)  # cheap first probes; doubles on success
        self.plain_s: float | None = None
        self.verify_s: float | None = None
        self.tokens_per_verify: float | None = None
        self.verify_samples = 0
        self.off_steps = 0
        self.backoff = 4
        self.since_plain = 0

    def propose(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Draft, unless speculation is backed off or a plain probe step is due."""
        if self.off_steps > 0:
            self.off_steps -= 1
            return []
        if self.since_plain >= self.probe_interval:
            return []
        return self.inner.propose(context, min(max_tokens, self.draft_len))

    def observe(self, step: StepRecord) -> None:
        """Update costs and acceptance; switch speculation off when it loses."""
        if step.num_drafted == 0:
            self.plain_s = _ema(self.plain_s, step.elapsed_s)
            self.since_plain = 0
            return
        self.since_plain += 1
        self.verify_s = _ema(self.verify_s, step.elapsed_s)
        self.tokens_per_verify = _ema(self.tokens_per_verify, step.num_accepted + 1.0)
        self.verify_samples += 1
        self._adapt_length(step)
        if self.wins() is False:
            self.off_steps = self.backoff
            self.backoff = min(self.backoff * 2, self.max_backoff_steps)
            self.verify_samples = 0
        elif self.wins():
            self.backoff = 4

    def wins(self) -> bool | None:
        """Whether speculation beats plain decoding so far (None: not enough evidence)."""
        if self.verify_samples < self.min_samples or self.plain_s is None:
            return None
        assert self.verify_s is not None and self.tokens_per_verify is not None
        return self.tokens_per_verify / self.verify_s > 1.0 / self.plain_s

    def _adapt_length(self, step: StepRecord) -> None:
        if step.num_accepted == step.num_drafted:
            self.draft_len = min(self.max_draft_tokens, self.draft_len * 2)
        elif 2 * step.num_accepted < step.num_drafted:
            self.draft_len = max(1, self.draft_len // 2)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new
