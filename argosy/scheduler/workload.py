"""Workloads as the scheduler sees them: what they ask for, and where they run.

A workload is a gang: it runs on all of its devices or on none. Training jobs may be
elastic (`min_devices < max_devices`) and then resize through checkpoint-resume in
whole-node steps. An inference service (`kind="infer"`) is a set of one-device replicas
whose count follows a load profile; each replica is placed on its own.

`Workload` carries the request and the scheduler's bookkeeping (allocation, borrowing,
preemption count); the simulator adds progress in its own records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

KINDS: tuple[str, ...] = ("train", "finetune", "eval", "debug", "infer")
TRAINING_KINDS: frozenset[str] = frozenset({"train", "finetune"})


class State(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    REJECTED = "rejected"


@dataclass(eq=False, slots=True)
class Allocation:
    """Devices held on one node group: `nodes[i]` holds `counts[i]` devices of the job."""

    group: int
    nodes: np.ndarray
    counts: np.ndarray
    devices: int = -1
    """Total devices (computed from `counts` unless the caller gives it)."""

    def __post_init__(self) -> None:
        if self.devices < 0:
            self.devices = int(self.counts.sum())


@dataclass(eq=False, slots=True)
class Workload:
    """One trace entry plus the scheduler's state for it."""

    id: str
    kind: str
    queue: str
    priority: int
    chips: tuple[str, ...]
    min_devices: int
    max_devices: int
    submit_s: float = 0.0
    checkpoint_interval_s: float = 0.0
    per_node: int = 0
    """Devices on each node of the gang (its nodes are then `devices / per_node` distinct
    ones); 0: packed onto as few nodes as hold them. Fixed-size gangs only."""
    min_node: int = 0
    """Only node groups whose nodes have at least this many devices (a packed gang of
    `nnodes x nproc_per_node` then never gets more than `nnodes` nodes); 0: any."""
    # scheduler state
    state: State = State.PENDING
    alloc: Allocation | None = None
    chip: str | None = None
    borrowed: int = 0
    """Devices admitted above the queue's nominal share (reclaimable by other queues)."""
    lent: int = 0
    """Devices grown onto unused guarantees of other queues (first to be given back)."""
    started_s: float = -1.0
    segment_s: float = -1.0
    """When the current run segment started (preemption and resize restart it)."""
    next_room_s: float = 0.0
    """Earliest time this pending workload may again try to make room by preemption."""
    last_resize_s: float = -1e18
    grown_s: float = -1.0
    """When this job last grew (-1: it has not, or has since been shrunk)."""
    resize_stall_s: float = 0.0
    """Seconds this job has stood still for resizes (what `resize_budget_fraction` caps)."""
    state_bytes: float = 0.0
    """Training state (weights, gradients, optimizer) in bytes; prices the snapshot and
    restore of a resize (0: unknown, priced per rank by `resize_cost.ResizeCost`)."""
    preemptions: int = 0
    reserved_at_s: float = -1.0
    """Start time its first reservation promised (-1: never reserved; `scheduler.backfill`)."""
    reject_reason: str = ""
    replicas: list[Allocation] = field(default_factory=list)
    """Inference only: replica devices, in chunks (one device per replica)."""
    replica_count: int = 0
    """Inference only: devices in `replicas` (kept in step by `recount`)."""
    target_cache: tuple[int, int] = (-1, 0)
    """Inference only: (profile step, target replicas) of the last forecast."""
    profile: np.ndarray | None = None
    """Inference only: load per step over one day, as a fraction of peak (max 1)."""
    profile_step_s: float = 600.0
    """Inference only: seconds per profile step."""

    def recount(self) -> None:
        self.replica_count = sum(r.devices for r in self.replicas)

    def load_at(self, t_s: float) -> float:
        """Inference load at time `t_s` as a fraction of the peak."""
        if self.profile is None:
            return 1.0
        step = int(t_s // self.profile_step_s) % len(self.profile)
        return float(self.profile[step])

    def needed_replicas(self, t_s: float) -> int:
        """Replicas that serve the load at `t_s` within the SLO (one device each)."""
        return int(np.ceil(self.max_devices * self.load_at(t_s) - 1e-9))

    @property
    def elastic(self) -> bool:
        return self.max_devices > self.min_devices and self.kind != "infer"

    @property
    def devices(self) -> int:
        if self.kind == "infer":
            return self.replica_count
        return self.alloc.devices if self.alloc is not None else 0
