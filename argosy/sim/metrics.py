"""What a simulation measured, and how each figure is computed.

Device-time is accounted exactly, event by event:

- allocated: devices held by workloads (jobs and inference replicas) x time;
- stalled: devices of a job that stands still (fault detection, restart, reload,
  resize checkpoint-resume) x time;
- lost: work rolled back to the last checkpoint on a preemption or fault, in
  device-seconds;
- idle replicas: inference replicas beyond what the load needs, x time.

    allocation_rate = allocated / capacity (all devices x the period)
    useful_rate     = (allocated - stalled - lost - idle replicas) / capacity
    effective_training_time = (allocated - stalled - lost) / allocated, over train+finetune
    slo_attainment  = share of service-steps whose replicas covered the load

Wait times (`queue_s`) count every job that was not rejected: a job still waiting at
the end counts with its wait so far (starved work is not left out of the percentiles).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argosy.scheduler.workload import KINDS

PERCENTILES = (50, 90, 99)


@dataclass
class Accounting:
    """Running sums, per workload kind (index = KINDS order)."""

    capacity_device_s: float
    allocated: np.ndarray = field(default_factory=lambda: np.zeros(len(KINDS)))
    stalled: np.ndarray = field(default_factory=lambda: np.zeros(len(KINDS)))
    lost: np.ndarray = field(default_factory=lambda: np.zeros(len(KINDS)))
    idle_replicas_s: float = 0.0
    slo_steps: int = 0
    slo_met: int = 0
    preemptions: int = 0
    resizes: int = 0
    resize_stall_device_s: float = 0.0
    """Device-seconds elastic jobs stood still for resizes (inside `stalled`)."""
    elastic_job_s: float = 0.0
    """Seconds elastic jobs were running (started and not yet ended), summed over jobs."""
    faults: int = 0
    quarantined: int = 0
    requeues: int = 0
    rejected: list[str] = field(default_factory=list)
    jct: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    queue: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    unstarted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    leaf_spread: list[tuple[float, float]] = field(default_factory=list)
    samples_t: list[float] = field(default_factory=list)
    samples: list[np.ndarray] = field(default_factory=list)


def report(acc: Accounting, *, policy: str, wall_s: float, extra: dict) -> dict:
    """The JSON report of one run."""
    cap = acc.capacity_device_s
    alloc = float(acc.allocated.sum())
    useful = alloc - float(acc.stalled.sum() + acc.lost.sum()) - acc.idle_replicas_s
    train = [KINDS.index("train"), KINDS.index("finetune")]
    t_alloc = float(acc.allocated[train].sum())
    t_kept = t_alloc - float(acc.stalled[train].sum() + acc.lost[train].sum())
    ett = t_kept / t_alloc if t_alloc else 0.0
    slo = acc.slo_met / acc.slo_steps if acc.slo_steps else 1.0
    out = {
        "policy": policy,
        "allocation_rate": alloc / cap,
        "useful_rate": useful / cap,
        "effective_training_time": ett,
        "slo_attainment": slo,
        "jct_s": _percentiles(acc.jct),
        "queue_s": _percentiles(acc.queue),
        "unstarted": {k: v for k, v in acc.unstarted.items() if v},
        "preemptions": acc.preemptions,
        "resizes": acc.resizes,
        "resize_churn": _churn(acc),
        "faults": acc.faults,
        "quarantined_nodes": acc.quarantined,
        "fault_requeues": acc.requeues,
        "rejected": len(acc.rejected),
        "lost_device_hours": float(acc.lost.sum()) / 3600,
        "stalled_device_hours": float(acc.stalled.sum()) / 3600,
        "idle_replica_device_hours": acc.idle_replicas_s / 3600,
        "five_factor": five_factor(acc, useful / cap, ett, extra),
        "sim_wall_s": wall_s,
    }
    out.update({k: v for k, v in extra.items() if not k.startswith("_")})
    return out


def _churn(acc: Accounting) -> dict[str, float]:
    """Resizes per elastic job-day, and the device-time their stalls cost."""
    days = acc.elastic_job_s / 86400
    return {
        "resizes_per_job_day": acc.resizes / days if days else 0.0,
        "stall_device_hours": acc.resize_stall_device_s / 3600,
        "stall_share": acc.resize_stall_device_s / acc.capacity_device_s,
    }


def _percentiles(values: dict[str, list[float]]) -> dict:
    return {
        kind: {f"p{p}": float(np.percentile(v, p)) for p in PERCENTILES} | {"n": len(v)}
        for kind, v in values.items()
        if v
    }


def five_factor(acc: Accounting, useful_rate: float, ett: float, extra: dict) -> dict:
    """Four measured factors whose product is delivered model FLOPs / owned peak FLOPs
    (`argosy.sim.ledger`), and the facility's energy factor beside them."""
    pue = extra.get("_pue", 1.2)
    ledger = extra.get("_ledger")
    values = ledger.factors() if ledger is not None else dict.fromkeys(_HOW, 0.0)
    plans = "stock plans for every policy" if extra.get("plans") == "stock" else (
        "argosy jobs run the planner's plan, baseline jobs the stock plan")  # fmt: skip
    energy = extra.get("energy")
    if energy is None:
        value, how = 1 / pue, f"1/PUE with PUE={pue} (assumed; a facility figure)"
    else:
        value = energy["useful_share"] / pue
        how = (f"IT energy of productive device-time / (IT energy x PUE {pue}); power: "
               f"{energy['how']}")  # fmt: skip
    out = {
        "energy_efficiency": {
            "value": value,
            "how": how + " (not in the product, which counts FLOPs)",
        },
    }
    for name, how in _HOW.items():
        out[name] = {"value": values[name], "how": how.format(plans=plans)}
    return out


_HOW = {
    "resource_utilization": "measured: allocated device-time / owned device-time (jobs and "
    "inference replicas), each device weighted by its chip's peak FLOP/s",
    "effective_training_time": "measured: productive / allocated device-time, peak-weighted; "
    "every stall (fault detection, restart, reload, resize), all work redone since the last "
    "checkpoint and idle inference replicas are lost here and only here",
    "single_chip_efficiency": "planner cost model: per job, the MFU of its model (llama3-8b, "
    "or llama3-70b for pretraining runs of 256+ devices) on the chip it ran on, the best over "
    "power-of-two sizes from one node up to its size; {plans}; inference replicas at "
    "sim.serving_mfu (assumed); weighted by productive device-time x peak FLOP/s",
    "parallel_scaling": "planner cost model: MFU at the job's size / its single-chip "
    "efficiency (same plan kind), times 1 - 0.05 x the share of leaf switches spanned beyond "
    "the fewest that could hold it (placement model); weighted by model FLOPs",
    "product": "delivered model FLOPs / owned peak FLOPs = the product of the four factors "
    "above (energy aside); a job also progresses at the rate its plan, chip and placement "
    "deliver (its trace work is in H100 device-seconds at the stock plan)",
}
