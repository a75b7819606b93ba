"""Config section of the scheduler layer: the knobs every policy shares."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SchedulerConfig(BaseModel):
    """How the scheduler admits, preempts, resizes and recovers workloads."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    min_runtime_s: float = Field(default=1800.0, ge=0)
    """A running workload cannot be preempted before it has run this long (Meta's rule)."""
    max_preemptions_per_job: int = Field(default=3, ge=0)
    """After this many preemptions a workload is no longer a preemption victim."""
    max_preemptors_per_cycle: int = Field(default=4, ge=0)
    """Blocked workloads that may try preemption in one cycle (bounds the cycle time)."""
    max_victims: int = Field(default=64, gt=0)
    """Most workloads evicted to make one preemptor fit."""
    resize_cost_s: float = Field(default=90.0, ge=0)
    """Checkpoint-resume pause of every device of an elastic job when it shrinks or grows."""
    min_resize_interval_s: float = Field(default=600.0, ge=0)
    """An elastic job grows at most once per this many seconds (bounds resize churn).
    (10 min: 7-day runs with resizes priced by job size gave 15 min 92.6% / 99.31%
    allocation / effective training time on h100:10000, 10 min 93.9% / 99.16%, 5 min
    95.6% / 99.00%, at the edge of the 99% target.)"""
    elastic_buffer_fraction: float = Field(default=0.01, ge=0, le=0.5)
    """Share of each group's devices elastic growth leaves free for arriving small jobs;
    a shrink to make room also restores it, so arrivals rarely force a resize. (1%: with
    resizes priced by job size, a few seconds each, a 2% buffer cost more allocation
    than the shrinks it saved.)"""
    shrink_batch_fraction: float = Field(default=0.03, ge=0, le=0.5)
    """A shrink to make room frees at least this share of the group's devices (whole
    nodes), so one checkpoint-resume serves a burst of arrivals, not one job."""
    elastic_overgrow: float = Field(default=2.0, ge=1.0)
    """An elastic job may grow to this multiple of its `max_devices` while nothing pending
    accepts its chip type (given back first when something arrives)."""
    resize_payback: float = Field(default=4.0, ge=1.0)
    """A growth must be expected to return this many times the device-seconds its resize
    stalls cost (the grow, and the shrink that later takes it back)."""
    resize_budget_fraction: float = Field(default=0.01, ge=0, le=1)
    """Resize stalls an elastic job may accumulate, as a share of the time it has run, on
    top of one grow and one shrink; urgent reclaims (guarantees) are not limited."""
    initial_hold_s: float = Field(default=7200.0, gt=0)
    """Expected time grown capacity is held before it is taken back, until the group has
    observed some (then an average of what it observed)."""
    forecast_lead_s: float = Field(default=1800.0, ge=0)
    """Inference replicas are sized for the peak load of the next this-many seconds."""
    usage_half_life_s: float = Field(default=86400.0, gt=0)
    """Half-life of each queue's decayed past use, which orders borrowing queues of equal
    share (the one that held devices lately goes after one that did not; Slurm's
    PriorityDecayHalfLife, Kueue's admission fair sharing)."""
    backfill_depth: int = Field(default=2000, gt=0)
    """Pending workloads examined per cycle after the head is blocked."""
    backfill_margin: float = Field(default=1.25, ge=1.0)
    """Run-time estimates are multiplied by this before a workload is started ahead of a
    reservation or on lent devices (the planner's step-time error is 8% median, 18% p90
    on published runs; a fault's restart adds minutes)."""
    backfill_scan: int = Field(default=32, ge=1)
    """Workloads of one request shape tried per cycle when the shape's head was refused
    only for its run time (Slurm's `bf_max_job_test`, per shape): bounds the cycle."""
    quarantine_failures: int = Field(default=2, ge=1)
    """Failures within `quarantine_window_s` that send a node to quarantine."""
    quarantine_window_s: float = Field(default=7 * 86400.0, gt=0)
    """Window over which a node's failures are counted for quarantine."""
    hardware_fault_rate_per_device_hour: float = Field(default=1.54e-5, ge=0)
    """Faults that take a node down, per device-hour, used to size each group's hot
    spares (Llama 3: 1.97e-5 interruptions x 78% hardware). The simulator sets it from
    its fault model unless it is given explicitly."""
    repair_s: float = Field(default=12 * 3600.0, gt=0)
    """Seconds a failed node stays down, used to size hot spares (assumption; the
    simulator sets it from its fault model unless it is given explicitly)."""
