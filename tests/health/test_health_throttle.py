"""The emulated slow device: work inflation and the RANK:FACTOR parser."""

import pytest

from argosy.core.errors import ConfigError
from argosy.health.throttle import Throttle, parse_slow


@pytest.mark.parametrize(
    ("factor", "iters", "want"),
    [(1.0, 10, 10), (0.5, 10, 20), (0.25, 8, 32), (0.75, 12, 16), (0.9, 1, 1), (0.5, 0, 0)],
    ids=["full", "half", "quarter", "three-quarters", "rounds-to-credit", "nothing"],
)
def test_throttle_inflates_the_work(factor: float, iters: int, want: int) -> None:
    assert Throttle(factor).iterations(iters) == want


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
