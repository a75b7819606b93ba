"""`relative_speed`: the scheduler's view of how fast a model runs on a chip."""

import time

import pytest

from argosy.core.errors import UnknownNameError
from argosy.planner import relative_speed
from argosy.planner.throughput import tokens_per_s_per_device


def test_reference_chip_is_one_and_older_chips_are_slower() -> None:
    assert relative_speed("llama3-8b", "h100") == pytest.approx(1.0)
    a100 = relative_speed("llama3-8b", "a100")
    assert 0.2 < a100 < 0.6
    assert relative_speed("llama3-8b", "b200") > 1.5


def test_speed_tracks_peak_when_memory_is_not_binding() -> None:
    # H800 is an H100 with a slower NVLink: at most as fast, and close.
    h800 = relative_speed("llama3-8b", "h800")
    assert 0.85 < h800 <= 1.0


def test_cached_and_fast() -> None:
    relative_speed("llama3-70b", "910b")
    started = time.perf_counter()
    for _ in range(100):
        relative_speed("llama3-70b", "910b")
    assert time.perf_counter() - started < 0.5


def test_big_model_is_priced_on_enough_devices() -> None:
    assert tokens_per_s_per_device("llama3-405b", "a100") > 0


def test_unknown_chip_lists_known_ones() -> None:
    with pytest.raises(UnknownNameError):
        relative_speed("llama3-8b", "h1000")
