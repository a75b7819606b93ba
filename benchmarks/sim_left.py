"""What a simulation left undone at its horizon (benchmarks/sim.py `left`).

`left_at_horizon(simulation)` (after `run()`): the training work of every job not
finished at the horizon, in product points (its remaining work credited as the ledger
credits progress, over the owned peak FLOPs), grouped by (state, kind, accepted chips),
largest first. The groups sum to the trace's ceiling minus the run's product: what a
better policy could still have delivered on this trace.
"""

from __future__ import annotations

import collections
from typing import Any

MIN_POINTS = 1e-6


def left_at_horizon(simulation: Any) -> list[dict[str, Any]]:
    ledger, horizon = simulation.ledger, simulation.horizon
    points: dict[tuple, float] = collections.Counter()
    ages: dict[tuple, list[float]] = collections.defaultdict(list)
    for job in simulation.jobs.values():
        w = job.w
        if w.kind == "infer" or job.work - job.done <= 0:
            continue
        value = (job.work - job.done) * ledger.work_flops(w) / ledger.owned
        if value < MIN_POINTS:  # finished but for rounding
            continue
        state = "running" if job.devices else "never started" if not job.starts else "waiting"
        key = (state, w.kind, "+".join(sorted(w.chips)))
        points[key] += value
        ages[key].append((horizon - w.submit_s) / 86400)
    rows = []
    for key, value in sorted(points.items(), key=lambda kv: -kv[1]):
        days = sorted(ages[key])
        rows.append({
            "state": key[0], "kind": key[1], "chips": key[2], "product_points": value,
            "jobs": len(days),
            "days_before_end": f"{days[0]:.1f}-{days[-1]:.1f} (median {days[len(days) // 2]:.1f})",
        })  # fmt: skip
    return rows
