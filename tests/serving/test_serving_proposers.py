"""Proposers: n-gram lookup drafts what followed the suffix; `auto` backs off when it loses."""

import pytest

from argosy.core.errors import UnknownNameError
from argosy.serving.speculative import PROPOSERS, StepRecord
from argosy.serving.speculative.adaptive import AdaptiveProposer
from argosy.serving.speculative.ngram import NgramProposer


@pytest.mark.parametrize(
    ("context", "max_tokens", "want_draft"),
    [
        ([1, 2, 3, 4, 5, 1, 2, 3], 3, [4, 5, 1]),
        ([1, 2, 3, 4, 5, 1, 2, 3], 1, [4]),
        ([7, 8, 9, 7, 8, 6, 7, 8], 2, [6, 7]),  # the latest earlier match wins
        ([1, 2, 3, 4, 5, 6], 4, []),  # no repeated suffix
        ([5, 5], 4, []),  # too short for a 2-gram with a follower
    ],
    ids=["copy", "limit", "latest-match", "no-match", "too-short"],
)
def test_ngram_drafts_what_followed_the_suffix(context, max_tokens, want_draft):
    assert NgramProposer(max_draft_tokens=8).propose(context, max_tokens) == want_draft


def test_registry_names_and_unknown_name():
    assert isinstance(PROPOSERS.get("prompt-lookup")(max_draft_tokens=4), NgramProposer)
    assert isinstance(PROPOSERS.get("auto")(max_draft_tokens=4), AdaptiveProposer)
    with pytest.raises(UnknownNameError, match="ngram"):
        PROPOSERS.get("eagle9")


COPY = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]


def _feed(proposer, plain_s, verify_s, accept_all, steps):
    drafted_steps = 0
    for _ in range(steps):
        draft = proposer.propose(COPY, 8)
        accepted = len(draft) if accept_all else 0
        elapsed = verify_s if draft else plain_s
        drafted_steps += bool(draft)
        proposer.observe(StepRecord(len(draft), accepted, elapsed))
    return drafted_steps


def test_auto_keeps_drafting_while_it_wins():
    proposer = AdaptiveProposer(max_draft_tokens=8)
    proposer.observe(StepRecord(0, 0, 0.1))  # one plain step measured
    assert _feed(proposer, 0.1, 0.15, accept_all=True, steps=40) >= 38
    assert proposer.draft_len == 8


def test_auto_backs_off_when_drafts_are_rejected():
    proposer = AdaptiveProposer(max_draft_tokens=8)
    proposer.observe(StepRecord(0, 0, 0.1))
    drafted = _feed(proposer, 0.1, 0.15, accept_all=False, steps=100)
    assert drafted < 20  # backed off, probing with growing intervals
    assert proposer.draft_len == 1


def test_auto_probes_a_plain_step_when_it_has_none():
    proposer = AdaptiveProposer(max_draft_tokens=8, probe_interval=5)
    seen = [bool(proposer.propose(COPY, 8)) for _ in range(1)]
    for _ in range(6):
        proposer.observe(StepRecord(4, 4, 0.1))
    seen.append(bool(proposer.propose(COPY, 8)))
    assert seen == [True, False]
