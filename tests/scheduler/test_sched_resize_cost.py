"""The resize-cost model: the restart curve goes through its calibration points, and
snapshot and restore scale with the state each rank holds."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import job, make

from argosy.scheduler import growth
from argosy.scheduler.policies import policies
from argosy.scheduler.resize_cost import (
    BYTES_PER_PARAM,
    RESTART_POINTS,
    ResizeCost,
    RestartPoint,
    training_state_bytes,
)

MODEL = ResizeCost()


@pytest.mark.parametrize(
    ("ranks", "want_s"),
    [(2, 1.29), (2048, 5.0), (10000, 30.0)],
    ids=["measured-here-2-ranks", "megascale-2048", "megascale-10000"],
)
def test_restart_curve_passes_through_its_calibration_points(ranks, want_s):
    assert MODEL.restart_s(ranks) == pytest.approx(want_s)
    assert any(p.ranks == ranks and p.seconds == want_s for p in RESTART_POINTS)


def test_restart_is_flat_below_the_first_point_and_keeps_the_last_slope_past_the_end():
    assert MODEL.restart_s(1) == MODEL.restart_s(2)
    slope = (30.0 - 5.0) / (10000 - 2048)
    assert MODEL.restart_s(20000) == pytest.approx(30.0 + slope * 10000)


def test_snapshot_and_restore_match_the_published_and_measured_bandwidths():
    glm_65b = training_state_bytes(65e9)  # DLRover: 0.2 s blocking on 1,536 H800
    snapshot = MODEL.seconds(glm_65b, 1536, 1536) - MODEL.seconds(glm_65b * 1e-9, 1536, 1536)
    restore_part = glm_65b / 1536 / 1e9 / MODEL.restore_gbps
    assert snapshot - restore_part == pytest.approx(0.2, rel=0.01)
    assert BYTES_PER_PARAM == 16.0
    # restore from host memory measured here: 3.02 GB in 0.37 s
    assert 3.02 / MODEL.restore_gbps == pytest.approx(0.37, rel=0.01)


def test_unknown_state_is_priced_at_dlrovers_per_rank_figure():
    assert MODEL.seconds(0, 64, 64) == pytest.approx(
        MODEL.restart_s(64) + MODEL.unknown_state_gb_per_rank * (1 / 3.4 + 1 / 8.2)
    )


@pytest.mark.parametrize(
    "points",
    [
        (RestartPoint(8, 1.0, "a"),),
        (RestartPoint(8, 1.0, "a"), RestartPoint(8, 2.0, "b")),
        (RestartPoint(8, 3.0, "a"), RestartPoint(64, 2.0, "b")),
    ],
    ids=["one-point", "same-ranks-twice", "falling"],
)
def test_a_bad_restart_curve_is_refused(points):
    with pytest.raises(ValueError, match="restart_points"):
        ResizeCost(restart_points=points)


@settings(max_examples=100, deadline=None)
@given(
    state=st.floats(1e6, 1e13),  # 0 means unknown: priced per rank
    more=st.floats(0, 1e13),
    before=st.integers(1, 50_000),
    after=st.integers(1, 50_000),
    extra=st.integers(0, 50_000),
)
def test_a_resize_costs_more_with_more_state_and_restarts_longer_with_more_ranks(
    state, more, before, after, extra
):
    cost = MODEL.seconds(state, before, after)
    assert cost > 0
    assert MODEL.seconds(state + more, before, after) >= cost
    assert MODEL.restart_s(after + extra) >= MODEL.restart_s(after)


def test_argosy_charges_by_job_size_and_a_policy_without_the_model_a_constant():
    sched, _ = make("h100:512", policy="argosy", a_nominal=256)
    small, large = job("s", devices=16), job("l", devices=256)
    small.state_bytes = training_state_bytes(8e9)  # the same state per rank
    large.state_bytes = small.state_bytes * 32
    small_s = growth.resize_cost(sched, small, 16, 8)
    assert small_s < growth.resize_cost(sched, large, 512, 256) < 45.2  # the old constant
    assert policies.get("quota").runtime.resize_model is None
    quota, _ = make("h100:512", policy="quota", a_nominal=256)
    want = quota.policy.runtime.resize_s or quota.config.resize_cost_s
    assert growth.resize_cost(quota, small, 16, 8) == growth.resize_cost(quota, large, 512, 8)
    assert growth.resize_cost(quota, small, 16, 8) == want
