"""The batch draft policy as pure decisions: how wide a batched verify pass is, given the
rows' acceptance and what wider passes cost at this batch size."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.serving.speculative import StepRecord
from argosy.serving.speculative.adaptive import AdaptiveProposer, expected_tokens
from argosy.serving.speculative.base import NEW_ROW_ACCEPTANCE, DraftOffer, ProposerContext
from argosy.serving.speculative.batch_policy import (
    MIN_GAIN,
    BatchDraftPolicy,
    batch_rate,
    draft_width,
)
from argosy.serving.speculative.costs import AcceptanceTracker, ForwardCosts
from argosy.serving.speculative.ngram import NgramProposer


def linear(fixed_s, per_token_s):
    """A forward pass that reads the weights once (fixed) and computes per token."""
    return lambda num_tokens: fixed_s + per_token_s * num_tokens


def rows(count, acceptance, offered=8, adaptive=True):
    return [DraftOffer(tuple(range(offered)), acceptance, adaptive)] * count


CPU_LIKE = linear(1.0, 0.1)  # memory-bound below ~10 tokens, compute-bound above
MEMORY_BOUND = linear(1.0, 0.001)
COMPUTE_BOUND = linear(0.0, 1.0)


@pytest.mark.parametrize(
    ("offers", "seconds", "want_width"),
    [
        (rows(2, 0.9), MEMORY_BOUND, 8),
        (rows(2, 0.9), COMPUTE_BOUND, 0),
        (rows(4, 0.1), CPU_LIKE, 0),
        (rows(1, 0.9) + rows(3, 0.0, offered=0), MEMORY_BOUND, 8),
        (rows(3, 0.1) + rows(1, 0.0, offered=3, adaptive=False), CPU_LIKE, 3),
        (rows(4, 0.9), lambda n: None, 0),
        (rows(3, 0.0, offered=0), CPU_LIKE, 0),
    ],
    ids=[
        "copy-memory-bound",
        "copy-compute-bound",
        "open-ended",
        "one-copy-row-others-plain",
        "fixed-row-sets-the-floor",
        "nothing-measured",
        "nothing-offered",
    ],
)
def test_draft_width_decisions(offers, seconds, want_width):
    assert draft_width(offers, seconds) == want_width


def test_copy_rows_draft_less_as_the_batch_grows_on_a_cpu_like_device():
    widths = [draft_width(rows(size, 0.9), CPU_LIKE) for size in (1, 2, 4, 8, 16, 32)]
    assert widths == sorted(widths, reverse=True)
    assert widths[0] >= 4 and widths[-1] < widths[0]


@given(
    acceptances=st.lists(st.floats(0.0, 0.99), min_size=1, max_size=16),
    offered=st.lists(st.integers(0, 8), min_size=16, max_size=16),
    fixed_s=st.floats(0.0, 2.0),
    per_token_s=st.floats(0.001, 1.0),
)
def test_the_chosen_width_is_the_best_and_only_taken_when_it_wins(
    acceptances, offered, fixed_s, per_token_s
):
    pairs = zip(acceptances, offered, strict=False)
    offers = [DraftOffer(tuple(range(d)), a, True) for a, d in pairs]
    seconds = linear(fixed_s, per_token_s)
    width = draft_width(offers, seconds)
    top = max(len(o.tokens) for o in offers)
    assert 0 <= width <= top
    rates = [batch_rate(offers, w, seconds) for w in range(top + 1)]
    if width > 0:
        assert rates[width] == max(rates[1:]) and rates[width] > MIN_GAIN * rates[0]
    else:
        assert all(rate <= MIN_GAIN * rates[0] for rate in rates)


@given(
    acceptance=st.floats(0.0, 0.99),
    fixed_s=st.floats(0.01, 2.0),
    per_token_s=st.floats(0.001, 1.0),
    sizes=st.lists(st.integers(1, 64), min_size=2, max_size=2, unique=True).map(sorted),
)
def test_more_rows_never_draft_wider_under_a_linear_cost(acceptance, fixed_s, per_token_s, sizes):
    seconds = linear(fixed_s, per_token_s)
    small, large = (draft_width(rows(n, acceptance), seconds) for n in sizes)
    assert large <= small


def test_forward_costs_interpolate_and_extrapolate():
    costs = ForwardCosts(extra_token_cost=0.5)
    assert costs.seconds(4) is None
    costs.observe(4, 0.4)
    costs.observe(12, 1.2)
    assert costs.seconds(4) == pytest.approx(0.4)
    assert costs.seconds(8) == pytest.approx(0.8)  # between seen counts: linear
    assert costs.seconds(2) == pytest.approx(0.2)  # below: proportional (plain looks cheap)
    assert costs.seconds(22) == pytest.approx(1.2 + 0.5 * 0.1 * 10)  # above: optimistic slope
    costs.observe(12, 2.2)  # a moving average, not the last value
    assert 1.2 < costs.seconds(12) < 2.2


@given(st.lists(st.tuples(st.integers(1, 200), st.floats(0.001, 10.0)), min_size=1, max_size=30))
def test_forward_costs_estimates_stay_positive_and_grow_beyond_the_widest_seen(samples):
    costs = ForwardCosts()
    for num_tokens, seconds in samples:
        costs.observe(num_tokens, seconds)
    widest = max(n for n, _ in samples)
    for num_tokens in (1, widest // 2 + 1, widest, widest + 5):
        assert costs.seconds(num_tokens) > 0
    assert costs.seconds(widest + 5) > costs.seconds(widest)


COPY = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]


def test_auto_offers_its_full_draft_and_the_policy_drops_it_once_it_loses():
    proposer = AdaptiveProposer(max_draft_tokens=8)
    for _ in range(5):
        proposer.observe(StepRecord(4, 4, 0.1, 0.05))
    offer = proposer.offer(COPY, 6)
    assert offer.adaptive and offer.tokens == (4, 5, 6, 7, 8, 9)
    assert offer.acceptance == pytest.approx(proposer.acceptance) and offer.acceptance > 0.8
    assert expected_tokens(offer.acceptance, 6) > 4
    for _ in range(15):
        proposer.observe(StepRecord(4, 0, 0.1, 0.05))
    assert not proposer.wins()  # alone it would back off ...
    losing = proposer.offer(COPY, 6)
    assert losing.tokens == (4, 5, 6, 7, 8, 9) and losing.acceptance < 0.1
    costs = ForwardCosts()
    costs.observe(16, 1.0)
    policy = BatchDraftPolicy(costs)
    assert policy.width([losing] * 16) == 0  # ... in a batch the policy verifies none of it
    assert policy.width([offer] * 16) > 0


def test_a_stale_slow_reading_gives_way_so_wider_passes_are_tried_again():
    costs = ForwardCosts(max_age=8)
    policy = BatchDraftPolicy(costs)
    offers = rows(16, 0.9)
    costs.observe(16, 1.0)
    costs.observe(32, 5.0)  # one noisy, slow pass at width 1
    assert policy.width(offers) == 0  # it rules every wider pass out ...
    for _ in range(8):
        costs.observe(16, 1.0)
    assert policy.width(offers) == 0  # ... while it is fresh
    costs.observe(16, 1.0)
    assert costs.seconds(32) == pytest.approx(1.25)  # stale: extrapolated from 16 again
    width = policy.width(offers)
    assert width > 0  # so the width is probed again
    costs.observe(16 * (1 + width), 2.0)  # and measured afresh, not averaged with the old
    assert costs.seconds(16 * (1 + width)) == pytest.approx(2.0)
    assert policy.width(offers) >= width  # it won: wider is explored next, not dropped


def test_a_stale_reading_below_every_fresh_one_is_kept():
    costs = ForwardCosts(max_age=2)
    costs.observe(16, 1.0)
    for _ in range(4):
        costs.observe(144, 3.0)
    assert costs.seconds(16) == pytest.approx(1.0)  # the floor's cost is not forgotten
    assert costs.seconds(80) == pytest.approx(2.0)


def test_rows_start_from_the_engines_running_acceptance():
    warm = AdaptiveProposer(max_draft_tokens=8, context=ProposerContext(acceptance=0.9))
    cold = AdaptiveProposer(max_draft_tokens=8)
    low = AdaptiveProposer(max_draft_tokens=8, context=ProposerContext(acceptance=0.3))
    assert warm.offer(COPY, 6).tokens == (4, 5, 6, 7, 8, 9)
    assert warm.acceptance == pytest.approx(0.9)  # alone: it drafts at once (no probe) ...
    assert warm.offer(COPY, 6).acceptance == NEW_ROW_ACCEPTANCE  # ... in a batch it claims
    warm.observe(StepRecord(4, 4, 0.1, 0.1))  # little before its own drafts are verified
    assert warm.offer(COPY, 6).acceptance == pytest.approx(warm.acceptance)
    assert warm.acceptance > 0.9
    assert cold.offer(COPY, 6) == DraftOffer((4, 5, 6, 7, 8, 9), 0.5, adaptive=True)
    assert low.offer(COPY, 6).acceptance == pytest.approx(0.3)  # no probe in a batch: the
    costs = ForwardCosts()
    costs.observe(16, 1.0)  # policy weighs the prior (batch 16, only plain passes seen)
    assert BatchDraftPolicy(costs).width([warm.offer(COPY, 8)] * 16) > 0
    assert BatchDraftPolicy(costs).width([low.offer(COPY, 8)] * 16) == 0


def test_engine_acceptance_follows_recent_verify_passes():
    tracker = AcceptanceTracker()
    assert tracker.acceptance("auto:") is None
    for _ in range(10):
        tracker.observe("auto:", 8, 8)
    high = tracker.acceptance("auto:")
    assert high == 1.0
    for _ in range(6):
        tracker.observe("auto:", 2, 0)
    assert tracker.acceptance("auto:") < 0.8 < high  # a few rejected passes cool it down
    assert tracker.acceptance("ngram:") is None


@given(
    context=st.lists(st.integers(0, 5), min_size=0, max_size=40),
    room=st.integers(0, 10),
    history=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=30),
)
def test_auto_offers_the_ngram_draft_in_a_batch_whatever_its_history(context, room, history):
    proposer = AdaptiveProposer(max_draft_tokens=8)
    for drafted, accepted in history:
        proposer.observe(StepRecord(drafted, min(accepted, drafted), 0.1, 0.2))
    offer = proposer.offer(context, room)
    assert offer.tokens == tuple(NgramProposer(max_draft_tokens=8).propose(context, room))
    assert offer.adaptive and 0.0 < offer.acceptance < 1.0
    verified = any(drafted for drafted, _ in history)
    claim = proposer.acceptance if verified else min(proposer.acceptance, NEW_ROW_ACCEPTANCE)
    assert offer.acceptance == pytest.approx(claim)
