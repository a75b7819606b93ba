"""Prompt-lookup (n-gram) proposer: copy what followed the last earlier match of the suffix.

Costs no model call. It finds the most recent earlier occurrence of the context's last
n tokens (n from `max_ngram` down to `min_ngram`) and drafts the tokens that followed it.
Wins when the output copies the input (grounded answers, code edits); drafts little on
open-ended text.
"""

from __future__ import annotations

from collections.abc import Sequence

from argosy.serving.speculative.base import ProposerContext


class NgramProposer:
    """Drafts by suffix matching over prompt and generated tokens."""

    def __init__(
        self,
        max_draft_tokens: int = 8,
        min_ngram: int = 2,
        max_ngram: int = 4,
        context: ProposerContext | None = None,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_draft_tokens = max_draft_tokens
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def propose(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Tokens that followed the latest earlier match of the longest matching suffix."""
        limit = min(max_tokens, self.max_draft_tokens)
        if limit <= 0:
            return []
        tokens = list(context)
        for size in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = _latest_match(tokens, size)
            if start is not None:
                follow = start + size
                return tokens[follow : follow + limit]
        return []


def _latest_match(tokens: list[int], size: int) -> int | None:
    """Start of the latest earlier occurrence of the last `size` tokens, if any."""
    suffix = tokens[-size:]
    first = suffix[0]
    for start in range(len(tokens) - size - 1, -1, -1):
        if tokens[start] == first and tokens[start : start + size] == suffix:
            return start
    return None
