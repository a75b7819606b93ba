"""Run-time estimates: how long a workload will hold its devices.

Backfill with reservations needs to know how long a gang will run: a candidate before
it starts, and a running gang from when it started (its expected end is recorded then,
as a batch system's time limit: `backfill.EndIndex`). The scheduler asks an `Estimator`
(the simulator's, from the planner's speed of each job's plan and its remaining work,
with an injected error; the live server passes none yet: a job spec carries no step
count to multiply the planner's step time by); without one it knows nothing, and every
estimate is `None`: backfill then falls back to what needs no estimate.

    sched.estimator = my_estimator
    run_s(sched, w, chip, devices)     # padded seconds w would run from now, or None

Estimates are padded by `SchedulerConfig.backfill_margin`, so a job estimated to end
before a reservation still does when the estimate was somewhat short.
"""

from __future__ import annotations

from typing import Protocol

from argosy.scheduler.workload import Workload


class Estimator(Protocol):
    """Seconds of work left, as far as the one who knows the jobs can tell."""

    def run_s(self, w: Workload, chip: str, devices: int) -> float | None:
        """Seconds `w` would take from now if it started on `devices` of `chip`."""


def run_s(sched, w: Workload, chip: str, devices: int) -> float | None:
    """Padded seconds `w` would run on `devices` of `chip`; None without an estimate."""
    est = sched.estimator
    if est is None:
        return None
    s = est.run_s(w, chip, devices)
    return None if s is None else s * sched.config.backfill_margin
