"""Run-time estimates: how long a workload will hold its devices.

Backfill with reservations needs to know when running gangs end and how long a
candidate would run. The scheduler asks an `Estimator` (the simulator's, from the
planner's speed of each job's plan and its remaining work, with an injected error; the
live server passes none yet: a job spec carries no step count to multiply the planner's
step time by); without one it knows nothing, and every estimate is `None`: backfill
then falls back to what needs no estimate.

    sched.estimator = my_estimator
    run_s(sched, w, chip, devices)     # seconds w would run from now, or None
    end_s(sched, w, now)               # when running w is expected to end, or None

Both are padded by `SchedulerConfig.backfill_margin`, so a job estimated to end before a
reservation still does when the estimate was somewhat short.
"""

from __future__ import annotations

from typing import Protocol

from argosy.scheduler.workload import Workload


class Estimator(Protocol):
    """Seconds of work left, as far as the one who knows the jobs can tell."""

    def run_s(self, w: Workload, chip: str, devices: int) -> float | None:
        """Seconds `w` would take from now if it started on `devices` of `chip`."""

    def remaining_s(self, w: Workload) -> float | None:
        """Seconds running `w` still needs at its present size."""


def run_s(sched, w: Workload, chip: str, devices: int) -> float | None:
    """Padded seconds `w` would run on `devices` of `chip`; None without an estimate."""
    est = sched.estimator
    if est is None:
        return None
    s = est.run_s(w, chip, devices)
    return None if s is None else s * sched.config.backfill_margin


def end_s(sched, w: Workload, now: float) -> float | None:
    """Padded time at which running `w` is expected to release its devices."""
    est = sched.estimator
    if est is None:
        return None
    s = est.remaining_s(w)
    return None if s is None else now + s * sched.config.backfill_margin
