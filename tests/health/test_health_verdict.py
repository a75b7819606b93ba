"""Verdict logic: thresholds, the node's worst verdict, peer factors robust to shared load."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.health.config import HealthConfig
from argosy.health.verdict import Verdict, classify, judge, overall, peer_factors

CONFIG = HealthConfig(degraded_below=0.8, failed_below=0.2)


@pytest.mark.parametrize(
    ("factor", "want"),
    [
        (1.3, Verdict.HEALTHY),
        (0.8, Verdict.HEALTHY),
        (0.79, Verdict.DEGRADED),
        (0.5, Verdict.DEGRADED),
        (0.2, Verdict.DEGRADED),
        (0.19, Verdict.FAILED),
        (0.0, Verdict.FAILED),
    ],
    ids=["faster", "at-threshold", "just-below", "half", "at-fail-line", "crippled", "dead"],
)
def test_classify_by_factor(factor: float, want: Verdict) -> None:
    assert classify(factor, CONFIG) is want


def test_judge_reports_value_expected_and_factor() -> None:
    got = judge("gemm.rank1", value=0.0425, expected=0.085, unit="TFLOP/s", config=CONFIG)
    assert got.verdict is Verdict.DEGRADED and got.factor == pytest.approx(0.5)
    assert (got.value, got.expected, got.unit) == (0.0425, 0.085, "TFLOP/s")
    with pytest.raises(ValueError, match="expected must be positive"):
        judge("x", value=1.0, expected=0.0, unit="GB/s", config=CONFIG)


def test_overall_is_the_worst_and_ignores_not_applicable() -> None:
    ok = judge("a", value=1.0, expected=1.0, unit="u", config=CONFIG)
    slow = judge("b", value=0.5, expected=1.0, unit="u", config=CONFIG)
    dead = judge("c", value=0.0, expected=1.0, unit="u", config=CONFIG)
    from argosy.health.verdict import not_applicable

    na = not_applicable("host_copy", "GB/s", "no accelerator")
    assert overall([ok, na]) is Verdict.HEALTHY
    assert overall([na]) is Verdict.HEALTHY
    assert overall([ok, slow, na]) is Verdict.DEGRADED
    assert overall([slow, dead, ok]) is Verdict.FAILED


def test_peer_factor_of_a_half_speed_rank() -> None:
    rounds = [[10.0, 5.0, 10.0, 10.0], [9.0, 4.5, 9.0, 9.0], [11.0, 5.5, 11.0, 11.0]]
    assert peer_factors(rounds) == pytest.approx([1.0, 0.5, 1.0, 1.0])
    assert peer_factors([[10.0, 5.0]]) == pytest.approx([2.0, 0.5])
    with pytest.raises(ValueError, match="at least 2 ranks"):
        peer_factors([[1.0]])


@given(
    factor=st.floats(0.1, 1.0),
    loads=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=9),
    num_ranks=st.integers(2, 8),
)
def test_load_shared_by_all_ranks_cancels(
    factor: float, loads: list[float], num_ranks: int
) -> None:
    """Outside load that slows a whole round slows every rank alike and leaves the factor."""
    rounds = [[load * (factor if r == 1 else 1.0) for r in range(num_ranks)] for load in loads]
    got = peer_factors(rounds)
    assert got[1] == pytest.approx(factor)
    assert all(f >= 1 - 1e-9 for r, f in enumerate(got) if r != 1)  # the others never look slow
