"""Scheduling policies as data: which mechanisms are on, and the runtime's recovery budget.

    fifo    first come, first served; strict order within a chip pool (a blocked head
            blocks every later job that accepts one of its chip types), no quotas, no
            preemption; inference holds its peak replicas all day.
    quota   Kueue-like: quotas with guarantee / nominal / ceiling and borrowing, priority
            order with fair sharing, backfill past blocked heads, preemption to reclaim
            borrowed quota and by priority; no elasticity, no co-location (inference
            holds its peak replicas, guarantees are never lent). Like Kueue, each queue
            admits one workload per cycle (kueue#14477), so bursts wait.
    argosy  everything: quota (admitting as many workloads per queue per cycle as fit)
            + elastic training (shrink instead of evict, grow into
            idle capacity), tidal inference (replicas follow a forecast of load; idle
            inference chips lent to elastic training and taken back ahead of peaks),
            hot spares, quarantine of repeatedly failing nodes, fast detection/restart,
            backfill with reservations (the blocked head of each pool gets a start time;
            later work starts ahead of it only if it ends before) and the services' idle
            guarantees lent to gangs that end before the forecast needs them.

Recovery budgets are per policy because they belong to the runtime the policy comes
with: a stock PyTorch job waits out the NCCL timeout (600 s) and restarts from disk;
argosy's runtime detects in tens of seconds and reloads from memory
(../shared/reference/fault_model.json `time_costs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from argosy.plugins.registry import Registry
from argosy.scheduler.resize_cost import ResizeCost


@dataclass(frozen=True)
class RuntimeBudget:
    """Seconds a job stands still per fault, besides the rework since its checkpoint."""

    detection_s: float
    restart_s: float
    reload_s: float
    resize_s: float = 0.0
    """Seconds a planned resize stops the job whatever its size (0: the scheduler
    config's `resize_cost_s`); not used when `resize_model` is set."""
    resize_model: ResizeCost | None = None
    """Snapshot + restart + restore of a resize by the job's size and state
    (`argosy.scheduler.resize_cost`)."""
    memory_checkpoint_s: float = 0.0
    """Seconds between in-memory snapshots a job can resume from (0: only its own
    checkpoints). argosy's flash checkpointer snapshots to host memory with the copy
    overlapped with compute (benchmarks/RESULTS.md, checkpoint: overlapped stall 0.00-0.01
    of DLRover's), so a fault redoes at most this much work."""

    @property
    def total_s(self) -> float:
        return self.detection_s + self.restart_s + self.reload_s


@dataclass(frozen=True)
class Policy:
    """Which scheduler mechanisms are switched on."""

    name: str
    order: str  # "fifo" (submit time, strict) or "fair" (priority, then fair share)
    quotas: bool
    backfill: bool
    preemption: bool
    elastic: bool
    tidal: bool
    hot_spares: bool
    quarantine: bool
    runtime: RuntimeBudget
    heads_per_queue: int = 0
    """Workloads each leaf queue may admit per cycle; 0 = as many as fit."""
    chip_aware: bool = False
    """Jobs that accept several chip types go to the least contested first, and fair
    share is counted in effective throughput (else: fastest type first, dominant share
    in devices, as Kueue's flavor order and fair sharing)."""
    trough_growth: bool = False
    """Elastic jobs also grow into inference capacity the services need only later than
    the forecast lead, when the time until then pays for the resizes
    (`argosy.scheduler.growth.lookaheads`); else never into what they need within the
    expected hold time. Off for argosy: on 7-day runs it moved the 3-chip mix's product
    by +0.1% (seed 0) and -1.8% (seed 1), h100:10000's by +0.5% and +0.0%."""
    batch_reclaim: bool = False
    """A service taking devices back from elastic jobs frees its whole shortfall with one
    shrink per job (else one node per shrink, a stall each)."""
    planner_plans: bool = False
    """Jobs run the planner's plan for the chips they were placed on (else the
    framework's stock plan for their model size)."""
    reservations: bool = False
    """Backfill with reservations, and the services' idle guarantees lent to gangs that
    end before the forecast needs them (`argosy.scheduler.backfill`); needs estimates."""


STOCK_RUNTIME = RuntimeBudget(detection_s=600.0, restart_s=600.0, reload_s=300.0)
# A planned resize on argosy's runtime: a blocking snapshot to host memory, hand-off to
# warm standby processes with a restart growing with the job's rank count, a restore from
# host memory; calibrated in argosy.scheduler.resize_cost (runtime measurements here,
# DLRover and MegaScale figures).
ARGOSY_RUNTIME = RuntimeBudget(
    detection_s=30.0,
    restart_s=120.0,
    reload_s=60.0,
    memory_checkpoint_s=300.0,
    resize_model=ResizeCost(),
)

policies: Registry[Policy] = Registry("policy")
policies.register(
    "fifo",
    Policy("fifo", "fifo", False, False, False, False, False, False, False, STOCK_RUNTIME),
)
policies.register(
    "quota",
    Policy(
        "quota",
        "fair",
        True,
        True,
        True,
        False,
        False,
        False,
        False,
        STOCK_RUNTIME,
        heads_per_queue=1,
    ),
    aliases=("kueue",),
)
policies.register(
    "argosy",
    Policy(
        "argosy",
        "fair",
        True,
        True,
        True,
        True,
        True,
        True,
        True,
        ARGOSY_RUNTIME,
        chip_aware=True,
        batch_reclaim=True,
        planner_plans=True,
        reservations=True,
    ),
)
