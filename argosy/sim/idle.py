"""Where unallocated device-time goes: the simulator's answer to "why is allocation short?".

At every load step (`sim.tick_s`) each chip pool's devices are split into one category
each, and the device-seconds are summed until the end of the run:

    allocated        held by a job or an inference replica
    down             failed or quarantined nodes (waiting for repair or replacement)
    hot_spares       idle whole nodes held back for faults
    blocked_frag     free devices on partly used nodes while work that accepts the chip waits
    blocked_whole    free whole nodes while work that accepts the chip waits (its gang
                     does not fit, its queue is at its ceiling, or it is held behind a head)
    growth_held      free devices, nothing waits for the chip, and an elastic job on it is
                     below its growth ceiling (growth was withheld: buffer, forecast of
                     inference, payback or resize budget)
    no_work          free devices, nothing waits for the chip and no job could take more

The categories add up to the pool's devices, so the table reads as a budget of the owned
device-time. Pure bookkeeping: it reads the scheduler's state, never changes it.

    idle = IdleBreakdown(sched)
    idle.sample(sched, step_s=600.0)          # at every load step
    idle.report()                             # {"h100": {"allocated": 0.86, ...}, ...}
"""

from __future__ import annotations

import numpy as np

from argosy.scheduler import growth

CATEGORIES = ("allocated", "down", "hot_spares", "blocked_frag", "blocked_whole",
              "growth_held", "no_work")  # fmt: skip


class IdleBreakdown:
    """Device-seconds per chip pool and category."""

    def __init__(self, sched) -> None:
        self.chips = sorted(set(sched.cap.chips))
        self.seconds = {c: dict.fromkeys(CATEGORIES, 0.0) for c in self.chips}

    def sample(self, sched, step_s: float) -> None:
        """Add `step_s` seconds of the cluster as it is now."""
        cap = sched.cap
        waiting = _chips_waited_for(sched)
        growable = _chips_with_growable_jobs(sched)
        for g, chip in enumerate(cap.chips):
            s, e = cap.ranges[g]
            owned = float(cap.cap[s:e].sum())
            down = float(cap.cap[s:e][~cap.up[s:e]].sum())
            spares = float(cap.cap[s:e][cap.spare[s:e]].sum())
            avail = cap.avail[s:e]
            whole = float(avail[avail == cap.dpn[g]].sum())
            frag = float(avail.sum()) - whole
            held = owned - down - spares - whole - frag
            row = self.seconds[chip]
            row["allocated"] += held * step_s
            row["down"] += down * step_s
            row["hot_spares"] += spares * step_s
            if chip in waiting:
                row["blocked_frag"] += frag * step_s
                row["blocked_whole"] += whole * step_s
            elif chip in growable:
                row["growth_held"] += (frag + whole) * step_s
            else:
                row["no_work"] += (frag + whole) * step_s

    def report(self) -> dict[str, dict[str, float]]:
        """Share of each pool's owned device-time per category, and `all` (the cluster)."""
        out: dict[str, dict[str, float]] = {}
        total = dict.fromkeys(CATEGORIES, 0.0)
        for chip, row in self.seconds.items():
            owned = sum(row.values())
            out[chip] = {k: v / owned if owned else 0.0 for k, v in row.items()}
            for k, v in row.items():
                total[k] += v
        owned = sum(total.values())
        out["all"] = {k: v / owned if owned else 0.0 for k, v in total.items()}
        return out


def _chips_waited_for(sched) -> set[str]:
    """Chip types some pending workload accepts."""
    out: set[str] = set()
    for shape in sched.pending.by_shape:
        out.update(shape[1])
    return out


def _chips_with_growable_jobs(sched) -> set[str]:
    """Chip types on which an elastic job holds less than it may grow to."""
    if not sched.policy.elastic:
        return set()
    return {
        w.chip
        for w in sched.elastic_running.values()
        if w.chip is not None and w.devices < growth.max_size(sched, w)
    }


def format_rows(report: dict[str, dict[str, float]]) -> list[list[str]]:
    """Rows (category, share per pool...) for a table, pools in report order."""
    pools = list(report)
    return [[k, *(f"{100 * report[p][k]:.1f}%" for p in pools)] for k in CATEGORIES]


def total_share(report: dict[str, dict[str, float]]) -> float:
    """Sum of the cluster's shares (1.0 up to rounding): a self-check for tests."""
    return float(np.sum(list(report["all"].values())))
