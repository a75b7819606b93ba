"""The emulated slow device: work inflation and the RANK:FACTOR parser."""

import pytest

from argosy.core.errors import ConfigError
from argosy.health.throttle import Throttle, parse_slow


@pytest.mark.parametrize(
    ("factor", "runs", "want"),
    [(1.0, 40, 40.0), (0.5, 40, 20.0), (0.25, 40, 10.0), (0.75, 12, 9.0), (0.5, 0, 0.0)],
    ids=["full", "half", "quarter", "three-quarters", "nothing"],
)
def test_throttle_counts_a_share_of_the_work(factor: float, runs: int, want: float) -> None:
    assert Throttle(factor).useful(runs) == pytest.approx(want)
    with pytest.raises(ValueError, match="non-negative"):
        Throttle(factor).useful(-1)


@pytest.mark.parametrize("factor", [0.0, -0.5, 1.5])
def test_throttle_rejects_impossible_factors(factor: float) -> None:
    with pytest.raises(ConfigError, match="throttle factor"):
        Throttle(factor)


def test_parse_slow() -> None:
    assert parse_slow([]) == {}
    assert parse_slow(["1:0.5", "0:0.75"], num_ranks=2) == {1: 0.5, 0: 0.75}


@pytest.mark.parametrize(
    ("specs", "want"),
    [
        (["1"], "RANK:FACTOR"),
        (["a:0.5"], "RANK:FACTOR"),
        (["1:x"], "RANK:FACTOR"),
        (["-1:0.5"], "RANK:FACTOR"),
        (["1:2"], r"\(0, 1\]"),
        (["1:0"], r"\(0, 1\]"),
        (["3:0.5"], "rank 3 of 2"),
        (["1:0.5", "1:0.7"], "given twice"),
    ],
    ids=[
        "no-factor",
        "bad-rank",
        "bad-factor",
        "negative-rank",
        "too-fast",
        "zero",
        "beyond",
        "twice",
    ],
)
def test_parse_slow_rejects_bad_input(specs: list[str], want: str) -> None:
    with pytest.raises(ConfigError, match=want):
        parse_slow(specs, num_ranks=2)
