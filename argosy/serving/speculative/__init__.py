"""Speculative-decoding proposers, registered by name.

A proposer drafts tokens from the context; the engine verifies every draft in one forward
pass and keeps only what the target model itself would have produced, so speculation never
changes greedy output. Proposers are built per request (they may keep per-request state).

    proposer = PROPOSERS.get("ngram")(max_draft_tokens=8)
    draft = proposer.propose(context_ids, 8)
"""

from argosy.serving.speculative.base import PROPOSERS, ObservesSteps, Proposer, StepRecord

PROPOSERS.register(
    "ngram", "argosy.serving.speculative.ngram:NgramProposer", aliases=("prompt-lookup",)
)
PROPOSERS.register(
    "auto", "argosy.serving.speculative.adaptive:AdaptiveProposer", aliases=("adaptive",)
)

__all__ = ["PROPOSERS", "ObservesSteps", "Proposer", "StepRecord"]
