"""Hang and straggler decisions over hand-built board snapshots."""

import numpy as np
import pytest

from argosy.runtime.board import ROW, Slot
from argosy.runtime.config import RuntimeConfig
from argosy.runtime.watchdog import HangDetector, StragglerDetector


def board(rows: list[dict[Slot, float]]) -> np.ndarray:
    snap = np.zeros((len(rows), ROW))
    for rank, row in enumerate(rows):
        for slot, value in row.items():
            snap[rank, slot] = value
    return snap


def stepping(heartbeat: float, entered: int, exited: int, step: int = 10) -> dict[Slot, float]:
    return {
        Slot.STEP_COUNT: step,
        Slot.STEP: step,
        Slot.HEARTBEAT: heartbeat,
        Slot.COLL_ENTERED: entered,
        Slot.COLL_EXITED: exited,
    }


def test_threshold_is_k_times_p99_or_the_floor() -> None:
    config = RuntimeConfig(hang_floor_s=5.0, hang_p99_factor=10.0)
    hang = HangDetector(config)
    assert hang.threshold_s() == 5.0
    for _ in range(100):
        hang.observe_step_time(0.1)
    assert hang.threshold_s() == 5.0  # 10 x 0.1 s is below the floor
    for _ in range(100):
        hang.observe_step_time(2.0)
    assert hang.threshold_s() == pytest.approx(20.0)


def test_no_hang_while_within_threshold() -> None:
    hang = HangDetector(RuntimeConfig(hang_floor_s=5.0))
    snap = board([stepping(100.0, 4, 3), stepping(101.0, 3, 3)])
    assert hang.check(snap, [0, 1], spawned_at=0.0, now=104.9) is None


def test_hang_names_the_rank_that_never_entered_the_collective() -> None:
    hang = HangDetector(RuntimeConfig(hang_floor_s=5.0))
    snap = board([stepping(100.0, 7, 6), stepping(99.0, 6, 6)])
    verdict = hang.check(snap, [0, 1], spawned_at=0.0, now=106.0)
    assert verdict is not None
    assert verdict.missing_ranks == (1,)
    assert verdict.collective_seq == 7
    assert verdict.stalled_s == pytest.approx(6.0)  # the group's last move was at 100


def test_hang_inside_a_collective_everyone_entered_blames_the_transport() -> None:
    hang = HangDetector(RuntimeConfig(hang_floor_s=1.0))
    snap = board([stepping(10.0, 5, 4), stepping(10.0, 5, 4)])
    verdict = hang.check(snap, [0, 1], spawned_at=0.0, now=12.0)
    assert verdict is not None and verdict.missing_ranks == (0, 1)
    assert "transport" in verdict.detail


def test_without_collectives_the_rank_behind_in_steps_is_named() -> None:
    hang = HangDetector(RuntimeConfig(hang_floor_s=1.0))
    snap = board([stepping(10.0, 0, 0, step=8), stepping(10.0, 0, 0, step=9)])
    verdict = hang.check(snap, [0, 1], spawned_at=0.0, now=20.0)
    assert verdict is not None and verdict.missing_ranks == (0,)


def test_startup_timeout_applies_before_the_first_step() -> None:
    hang = HangDetector(RuntimeConfig(startup_timeout_s=30.0, hang_floor_s=1.0))
    snap = board([stepping(5.0, 0, 0, step=1), {}])
    assert hang.check(snap, [0, 1], spawned_at=0.0, now=29.0) is None
    verdict = hang.check(snap, [0, 1], spawned_at=0.0, now=31.0)
    assert verdict is not None and verdict.missing_ranks == (1,)


def feed(detector: StragglerDetector, steps: range, times: dict[int, float]) -> None:
    for step in steps:
        for rank, seconds in times.items():
            detector.observe(rank, step, seconds)


def test_consistent_straggler_is_confirmed_with_its_factor() -> None:
    config = RuntimeConfig(straggler_window=10, straggler_threshold=1.5, straggler_confirm_s=5)
    slow = StragglerDetector(config, world_size=4)
    feed(slow, range(1, 10), {0: 0.1, 1: 0.1, 2: 0.25, 3: 0.1})
    assert slow.check(now=0.0) is None  # window not yet full
    feed(slow, range(10, 11), {0: 0.1, 1: 0.1, 2: 0.25, 3: 0.1})
    assert slow.check(now=1.0) is None  # flagged, not yet for confirm_s
    verdict = slow.check(now=6.0)
    assert verdict is not None and verdict.rank == 2
    assert verdict.slowdown == pytest.approx(2.5)
    assert slow.check(now=7.0, exclude={2}) is None


def test_a_burst_shorter_than_confirm_s_is_not_reported() -> None:
    config = RuntimeConfig(straggler_window=5, straggler_confirm_s=5)
    slow = StragglerDetector(config, world_size=2)
    feed(slow, range(1, 6), {0: 0.1, 1: 0.3})
    assert slow.check(now=0.0) is None
    feed(slow, range(6, 11), {0: 0.1, 1: 0.1})  # the burst is over
    assert slow.check(now=3.0) is None
    feed(slow, range(11, 16), {0: 0.1, 1: 0.3})  # slow again: the clock restarts
    assert slow.check(now=4.0) is None
    assert slow.check(now=8.0) is None
    assert slow.check(now=9.0) is not None


def test_occasional_slow_steps_are_not_a_straggler() -> None:
    config = RuntimeConfig(straggler_window=10, straggler_fraction=0.8)
    slow = StragglerDetector(config, world_size=2)
    for step in range(1, 21):
        feed(slow, range(step, step + 1), {0: 0.1, 1: 0.3 if step % 3 == 0 else 0.1})
    assert slow.check(now=100.0) is None


def test_straggler_needs_every_rank_of_a_step() -> None:
    slow = StragglerDetector(RuntimeConfig(straggler_window=3), world_size=2)
    feed(slow, range(1, 10), {1: 0.5})
    assert slow.check(now=100.0) is None


def test_a_checkpoint_that_moves_is_progress_one_that_stops_is_a_hang() -> None:
    hang = HangDetector(RuntimeConfig(hang_floor_s=5.0))
    saving = {**stepping(100.0, 4, 4), Slot.CKPT_BUSY: 1, Slot.T_CKPT_PROGRESS: 118.0}
    waiting = stepping(100.0, 5, 4)  # the peer waits in the next collective
    snap = board([saving, waiting])
    assert hang.check(snap, [0, 1], spawned_at=0.0, now=120.0) is None  # bytes still move
    verdict = hang.check(snap, [0, 1], spawned_at=0.0, now=123.5)  # 5.5 s without a byte
    assert verdict is not None and verdict.missing_ranks == (0,)
    assert verdict.stalled_s == pytest.approx(5.5)


def test_checkpoint_progress_counts_only_inside_a_checkpoint_call() -> None:
    hang = HangDetector(RuntimeConfig(hang_floor_s=5.0))
    after = {**stepping(100.0, 4, 4), Slot.CKPT_BUSY: 0, Slot.T_CKPT_PROGRESS: 118.0}
    snap = board([after, stepping(100.0, 5, 4)])
    assert hang.check(snap, [0, 1], spawned_at=0.0, now=106.0) is not None


@pytest.mark.parametrize("stall_s", [5.1, 7.0, 9.9])
def test_a_hang_beside_a_checkpoint_is_caught_within_the_floor(stall_s: float) -> None:
    """No grace: whatever the checkpoint did before, a stall longer than the threshold is
    reported, within the same <= 10 s as anywhere else."""
    hang = HangDetector(RuntimeConfig(hang_floor_s=5.0))
    saving = {**stepping(100.0, 4, 4), Slot.CKPT_BUSY: 1, Slot.T_CKPT_PROGRESS: 100.0}
    snap = board([saving, stepping(99.0, 5, 4)])
    assert hang.check(snap, [0, 1], spawned_at=0.0, now=100.0 + stall_s) is not None
