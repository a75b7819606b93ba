"""The simulator's run-time estimates, with the error a real one has, and how wrong they were.

A real scheduler learns how long a job will run from the planner: predicted step time x
the steps left. Here the truth is known (each job's remaining work and the speed of the
plan it would run on a chip and size: `FlopsLedger`), so the estimate is the truth times
one error factor per job, drawn once from a lognormal whose median absolute error is
`SimConfig.estimate_error` (the planner's measured step-time error on published runs it
was not fitted on). Restarts, resizes and faults after the estimate are not foreseen,
as a real estimate would not foresee them.

    est = SimEstimator(sim, error=0.083, seed=0)
    est.run_s(w, chip, devices)        # seconds w would run if it started now
    est.remaining_s(w)                 # seconds running w still needs
    est.observe_end(w, t)              # a job ended: score the estimate made at its start
    est.report()                       # {"jobs": n, "median_abs_error": ..., "p90_abs_error": ...}
"""

from __future__ import annotations

import math

import numpy as np

from argosy.scheduler.speed import relative_speed
from argosy.scheduler.workload import Workload
from argosy.sim.plans import job_model

Z75 = 0.6744897501960817  # the 75th percentile of a standard normal: median |N(0, 1)|


class SimEstimator:
    """Estimates from a simulation's jobs and ledger, each off by its own factor."""

    def __init__(self, sim, error: float, seed: int) -> None:
        self.sim = sim
        self.sigma = math.log1p(error) / Z75 if error > 0 else 0.0
        self.rng = np.random.default_rng(seed + 7919)
        self.factor: dict[str, float] = {}
        self.at_start: dict[str, tuple[float, float]] = {}  # id -> (start, estimated run)
        self.errors: list[float] = []

    def _factor(self, w: Workload) -> float:
        f = self.factor.get(w.id)
        if f is None:
            f = self.factor[w.id] = float(math.exp(self.sigma * self.rng.standard_normal()))
        return f

    def run_s(self, w: Workload, chip: str, devices: int) -> float | None:
        job = self.sim.jobs.get(w.id)
        if job is None or devices <= 0:
            return None
        rate = devices * self._speed(w, chip, devices)
        if rate <= 0:
            return None
        restart = self.sim.restart_s() if job.starts else 0.0
        return (restart + max(0.0, job.work - job.done) / rate) * self._factor(w)

    def remaining_s(self, w: Workload) -> float | None:
        job = self.sim.jobs.get(w.id)
        if job is None or job.rate <= 0:
            return None
        now = self.sim.clock.now_s()
        stall = max(0.0, job.stall_until - now)
        ran = max(0.0, now - max(job.t_update, job.stall_until))
        left = max(0.0, job.work - job.done - job.rate * ran)
        return (stall + left / job.rate) * self._factor(w)

    def started(self, w: Workload, t: float) -> None:
        """`w` started at `t`: remember what was estimated then, to score it at its end."""
        if w.id in self.at_start:
            return  # a restart: the first estimate is the one scored
        run = self.remaining_s(w)
        if run is not None:
            self.at_start[w.id] = (t, run)

    def observe_end(self, w: Workload, t: float) -> None:
        """`w` completed at `t`: the relative error of the estimate made at its start."""
        known = self.at_start.pop(w.id, None)
        if known is None:
            return
        start, estimated = known
        actual = t - start
        if actual > 0:
            self.errors.append((estimated - actual) / actual)

    def report(self) -> dict[str, float]:
        """Signed and absolute relative errors of the scored estimates."""
        if not self.errors:
            return {"jobs": 0, "median_abs_error": 0.0, "p90_abs_error": 0.0, "median_error": 0.0}
        e = np.asarray(self.errors)
        a = np.abs(e)
        return {
            "jobs": len(e),
            "median_abs_error": float(np.median(a)),
            "p90_abs_error": float(np.percentile(a, 90)),
            "median_error": float(np.median(e)),
        }

    def _speed(self, w: Workload, chip: str, devices: int) -> float:
        ledger = self.sim.ledger
        model = job_model(w.kind, w.max_devices)
        mfu, scaling = ledger.costs.efficiency(model, chip, devices, stock=ledger.stock)
        per_device = ledger.speed(w, ledger.peak[chip], mfu, scaling)
        return per_device if per_device > 0 else relative_speed(chip)
