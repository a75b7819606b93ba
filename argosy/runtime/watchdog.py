"""Hang and straggler detection from progress, as pure decisions over board snapshots.

Hang: no rank advanced (step, collective entry or exit, restore, or, while it is inside a
checkpoint call, the checkpoint's own progress: bytes copied, written, or arriving from
other ranks) for longer than max(k x recent p99 step time, floor). There is no grace for
checkpoints: a save that moves is progress, one that stops is a hang like any other. The
stalled collective is the highest sequence number any rank entered; the ranks that never
entered it are named as the culprits. Before a rank's first step the startup timeout
applies instead.

Straggler: per step, each rank's compute time (measured by the hooks, collectives
excluded) over the median of its peers; a rank above the threshold in most of the last
`window` steps is confirmed, with its median slowdown factor.

Neither detector reads a clock or touches a process: the agent feeds them and acts.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

from argosy.runtime.board import Slot
from argosy.runtime.config import RuntimeConfig


@dataclass(frozen=True)
class HangVerdict:
    """A confirmed hang: how long nothing moved, the threshold, and who is to blame."""

    stalled_s: float
    threshold_s: float
    since_s: float
    """Monotonic time of the last progress of any rank (the group stalled since)."""
    collective_seq: int
    missing_ranks: tuple[int, ...]
    """Ranks that never entered the stalled collective (or lag in steps)."""
    detail: str


@dataclass(frozen=True)
class StragglerVerdict:
    """A confirmed straggler: the rank, its slowdown factor, and the steps it spans."""

    rank: int
    slowdown: float
    first_step: int
    last_step: int


class HangDetector:
    """Keeps recent step times; `check` decides from one snapshot whether the group hangs."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self._step_times: deque[float] = deque(maxlen=config.step_history)

    def observe_step_time(self, seconds: float) -> None:
        if seconds > 0:
            self._step_times.append(seconds)

    def threshold_s(self) -> float:
        """max(k x p99 of recent step times, floor)."""
        if not self._step_times:
            return self.config.hang_floor_s
        p99 = float(np.percentile(np.fromiter(self._step_times, float), 99))
        return max(self.config.hang_p99_factor * p99, self.config.hang_floor_s)

    def check(
        self, snap: np.ndarray, live: list[int], spawned_at: float, now: float
    ) -> HangVerdict | None:
        """A verdict when the live ranks have made no progress for too long, else None."""
        if not live:
            return None
        if any(snap[r, Slot.STEP_COUNT] == 0 for r in live):
            return self._check_startup(snap, live, spawned_at, now)
        since = max(last_progress(snap, r) for r in live)
        stalled, threshold = now - since, self.threshold_s()
        if stalled <= threshold:
            return None
        seq, missing, detail = localize(snap, live)
        return HangVerdict(round(stalled, 3), round(threshold, 3), since, seq, missing, detail)

    def _check_startup(
        self, snap: np.ndarray, live: list[int], spawned_at: float, now: float
    ) -> HangVerdict | None:
        if now - spawned_at <= self.config.startup_timeout_s:
            return None
        waiting = tuple(r for r in live if snap[r, Slot.STEP_COUNT] == 0)
        detail = f"ranks {list(waiting)} made no step within {self.config.startup_timeout_s:g} s"
        threshold = self.config.startup_timeout_s
        return HangVerdict(round(now - spawned_at, 3), threshold, spawned_at, 0, waiting, detail)


def last_progress(snap: np.ndarray, rank: int) -> float:
    """When the rank last moved: its heartbeat, or its checkpoint's progress while it is
    inside a checkpoint call."""
    beat = float(snap[rank, Slot.HEARTBEAT])
    if snap[rank, Slot.CKPT_BUSY] > 0:
        return max(beat, float(snap[rank, Slot.T_CKPT_PROGRESS]))
    return beat


def localize(snap: np.ndarray, live: list[int]) -> tuple[int, tuple[int, ...], str]:
    """The stalled collective and the ranks that never entered it.

    With no collective instrumentation, the ranks behind in steps (or, when all are
    level, the one that last showed progress earliest) are named instead.
    """
    entered = {r: int(snap[r, Slot.COLL_ENTERED]) for r in live}
    seq = max(entered.values())
    if seq > 0 and min(entered.values()) < seq:
        missing = tuple(r for r in live if entered[r] < seq)
        inside = [r for r in live if entered[r] == seq]
        detail = f"ranks {list(inside)} wait in collective #{seq}; {list(missing)} never entered it"
        return seq, missing, detail
    if seq > 0 and all(snap[r, Slot.COLL_EXITED] < seq for r in live):
        detail = f"every rank entered collective #{seq} and none left it (transport stall)"
        return seq, tuple(live), detail
    steps = {r: int(snap[r, Slot.STEP]) for r in live}
    low = min(steps.values())
    if low < max(steps.values()):
        behind = tuple(r for r in live if steps[r] == low)
        return seq, behind, f"ranks {list(behind)} stuck after step {low}; others are ahead"
    stalest = min(live, key=lambda r: last_progress(snap, r))
    return seq, (stalest,), f"rank {stalest} showed progress last, at step {low}"


class StragglerDetector:
    """Per-step compute times of every rank; confirms a consistently slow one.

    Over the last `window` steps every rank reported, a rank is a straggler when the
    median of its compute times is `threshold` times the median of its peers' medians
    (robust to one noisy step), it was the slower one in at least `fraction` of the
    steps, and both have held for `confirm_s` seconds of checks (not a burst).
    """

    def __init__(self, config: RuntimeConfig, world_size: int) -> None:
        self.config = config
        self.world_size = world_size
        self._pending: dict[int, dict[int, float]] = defaultdict(dict)
        self._rows: deque[tuple[int, dict[int, float]]] = deque(maxlen=config.straggler_window)
        self._since: dict[int, float] = {}

    def observe(self, rank: int, step: int, compute_s: float) -> None:
        """Record one rank's compute time for one step; a complete step joins the window."""
        if self.world_size < 2 or compute_s <= 0:
            return
        row = self._pending[step]
        row[rank] = compute_s
        if len(row) < self.world_size:
            return
        self._rows.append((step, self._pending.pop(step)))
        for old in [s for s in self._pending if s < step - 4 * self.config.straggler_window]:
            del self._pending[old]

    def check(self, now: float, exclude: set[int] = frozenset()) -> StragglerVerdict | None:
        """The slowest straggler not in `exclude` that has held `confirm_s` by `now`, or None."""
        flagged = {v.rank: v for v in self._flagged(exclude)}
        self._since = {r: self._since.get(r, now) for r in flagged}
        confirmed = [
            v for r, v in flagged.items() if now - self._since[r] >= self.config.straggler_confirm_s
        ]
        return max(confirmed, key=lambda v: v.slowdown, default=None)

    def _flagged(self, exclude: set[int]) -> list[StragglerVerdict]:
        """Ranks that look slow over the current window."""
        if len(self._rows) < self.config.straggler_window:
            return []
        rows = [row for _, row in self._rows]
        medians = {r: statistics.median(row[r] for row in rows) for r in range(self.world_size)}
        found = []
        for rank in range(self.world_size):
            if rank in exclude:
                continue
            peers = statistics.median(m for r, m in medians.items() if r != rank)
            factor = medians[rank] / peers if peers > 0 else 1.0
            slower = sum(
                row[rank] > statistics.median(v for r, v in row.items() if r != rank)
                for row in rows
            )
            if factor >= self.config.straggler_threshold and (
                slower >= self.config.straggler_fraction * len(rows)
            ):
                first, last = self._rows[0][0], self._rows[-1][0]
                found.append(StragglerVerdict(rank, round(factor, 3), first, last))
        return found

    def reset(self) -> None:
        self._pending.clear()
        self._rows.clear()
        self._since.clear()
