"""What the scheduler tells whoever applies its decisions (the simulator, the server).

start     the workload begins on `after` devices
resize    an elastic job goes from `before` to `after` devices (checkpoint-resume)
preempt   the whole gang is evicted back to pending; work since its checkpoint is lost
restart   a fault stopped it; it restarts on the same (or hot-spare) devices
requeue   a fault stopped it and no spare was at hand; it waits for a new placement
replicas  an inference service now has `after` replicas
reject    it can never fit; `reason` says why
"""

from __future__ import annotations

from dataclasses import dataclass

from argosy.scheduler.workload import Workload

ACTIONS: tuple[str, ...] = (
    "start",
    "resize",
    "preempt",
    "restart",
    "requeue",
    "replicas",
    "reject",
)


@dataclass(slots=True)
class Decision:
    """One change to one workload."""

    action: str
    workload: Workload
    before: int
    after: int
    reason: str = ""
