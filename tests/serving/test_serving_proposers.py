"""Proposers: n-gram lookup drafts what followed the suffix; `auto` backs off when it loses."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.core.errors import UnknownNameError
from argosy.serving.speculative import PROPOSERS, StepRecord
from argosy.serving.speculative.adaptive import AdaptiveProposer, expected_tokens
from argosy.serving.speculative.costs import DEFAULT_DRAFT_TOKEN_COST, StepCosts
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
    assert _feed(proposer, 0.1, 0.15, accept_all=True, steps=40) == 40
    assert proposer.draft_len == 8


def test_auto_backs_off_after_one_rejected_probe_and_probes_rarely():
    proposer = AdaptiveProposer(max_draft_tokens=8)
    drafted = _feed(proposer, 0.1, 0.15, accept_all=False, steps=200)
    assert drafted <= 6  # the first probe, then probes after 8, 16, 32, 64, 128 plain steps
    assert not proposer.wins()


@pytest.mark.parametrize(
    ("accepted_of_4", "draft_token_cost", "want_on"),
    [(0, 0.05, False), (4, 0.05, True), (1, 0.05, True), (4, 1.5, False), (1, 0.5, False)],
    ids=["rejected", "accepted-cheap", "some-cheap", "accepted-too-costly", "some-costly"],
)
def test_auto_drafts_only_when_the_cost_model_says_it_pays(
    accepted_of_4, draft_token_cost, want_on
):
    proposer = AdaptiveProposer(max_draft_tokens=8)
    for _ in range(5):
        proposer.observe(StepRecord(4, accepted_of_4, 0.1, draft_token_cost))
    assert (proposer.draft_len > 0) == want_on


@given(
    acceptance=st.floats(0.0, 1.0),
    cost=st.floats(0.0, 2.0),
    max_draft=st.integers(1, 16),
)
def test_auto_picks_the_draft_length_with_the_best_expected_gain(acceptance, cost, max_draft):
    proposer = AdaptiveProposer(max_draft_tokens=max_draft)
    proposer.probing = False
    proposer.draft_token_cost = cost
    proposer.accepted_weight, proposer.rejected_weight = acceptance, 1.0 - acceptance
    if acceptance in (0.0, 1.0):
        proposer.accepted_weight, proposer.rejected_weight = acceptance + 1e-9, 1.0 - acceptance
    k = proposer.draft_len
    rate = proposer.acceptance
    gains = [expected_tokens(rate, j) / (1 + cost * j) for j in range(1, max_draft + 1)]
    if k == 0:
        assert max(gains) <= proposer.min_gain
    else:
        assert gains[k - 1] == max(gains) and gains[k - 1] > proposer.min_gain


def test_step_costs_read_a_draft_tokens_cost_from_a_full_drafts_pass():
    costs = StepCosts(max_draft_tokens=8)
    assert costs.draft_token_cost == DEFAULT_DRAFT_TOKEN_COST  # nothing measured
    for _ in range(5):
        costs.observe(0, 0.10)
    assert costs.draft_token_cost == DEFAULT_DRAFT_TOKEN_COST  # no verify pass yet
    costs.observe(2, 0.20)  # one slow short pass (noise, or a slow kernel shape) ...
    assert costs.draft_token_cost == pytest.approx(0.25)  # ... extrapolates optimistically
    for _ in range(5):
        costs.observe(8, 0.15)  # a full draft costs half a plain step more
    assert costs.draft_token_cost == pytest.approx(0.5 / 8)


@given(
    steps=st.lists(st.tuples(st.integers(0, 8), st.floats(1e-4, 10.0)), min_size=1, max_size=40),
)
def test_step_costs_stay_in_range_and_rise_with_slower_full_drafts(steps):
    costs = StepCosts(max_draft_tokens=8)
    for drafted, seconds in steps:
        costs.observe(drafted, seconds)
    assert 0.0 <= costs.draft_token_cost <= 2.0
    if costs.plain_s is not None and costs.samples:
        before = costs.draft_token_cost
        costs.observe(8, 10 * costs.forward.seconds(9))
        assert costs.draft_token_cost >= before
