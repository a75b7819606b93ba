"""Node isolation in the simulator: who decides that a node leaves service.

    class NodeIsolation(Protocol):
        def observe_fault(self, node, at_s, *, hardware) -> bool   # True: quarantine now
        def observe_replaced(self, node, at_s) -> None

The simulator reports every fault the runtime pins on a node (hardware: the node went
down; transient: the job restarted in place) and every replacement of a quarantined
node. A quarantined node is drained (its gangs move to hot spares, as after a hardware
fault), stays out when repaired, and is replaced after `sim.quarantine_replace_s` by a
node that fails at the ordinary rate (a lemon is culled).

With no isolation given, a policy with `quarantine` keeps the scheduler's own rule
(`quarantine_failures` hardware faults within `quarantine_window_s`, `scheduler/
recovery.py`). `argosy sim run` passes `HealthPolicyIsolation`, the health layer's
node-record policy (`argosy.health.policy`, the rule the runtime and the server apply);
`NoIsolation` keeps every node in service (the baseline for "what does isolation buy").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from argosy.health.policy import Evidence, NodeRecord
    from argosy.scheduler.config import SchedulerConfig


class NodeIsolation(Protocol):
    """Decides, from the faults seen on a node, whether it is quarantined."""

    def observe_fault(self, node: int, at_s: float, *, hardware: bool) -> bool:
        """A fault on `node` at `at_s`; True when the node must leave service now."""
        ...

    def observe_replaced(self, node: int, at_s: float) -> None:
        """The quarantined `node` was replaced by a healthy one."""
        ...


class NoIsolation:
    """Never takes a node out of service (lemon nodes keep failing)."""

    def observe_fault(self, node: int, at_s: float, *, hardware: bool) -> bool:
        return False

    def observe_replaced(self, node: int, at_s: float) -> None:
        return None


class HealthPolicyIsolation:
    """The simulator's node isolation decided by the health layer's node-record policy
    (`argosy.health.policy`): every fault the runtime pins on a node is fault evidence, a
    replaced node is a repair (on probation), and a node is quarantined when the policy
    says so. Thresholds come from the scheduler config so the rule reads the same:
    `quarantine_failures` faults within `quarantine_window_s` (transient faults count
    too, which the scheduler's own rule does not see)."""

    def __init__(self, scheduler: SchedulerConfig) -> None:
        from argosy.health.config import NodePolicyConfig

        score = float(scheduler.quarantine_failures)
        self.config = NodePolicyConfig(window_s=scheduler.quarantine_window_s,
                                       cordon_score=score, quarantine_score=score,
                                       fault_weight=1.0)  # fmt: skip
        self.records: dict[int, NodeRecord] = {}

    def observe_fault(self, node: int, at_s: float, *, hardware: bool) -> bool:
        from argosy.health.policy import Evidence, EvidenceKind

        detail = "hardware fault" if hardware else "transient fault"
        record = self._decide(node, Evidence(EvidenceKind.FAULT, at_s, detail))
        return not record.state.in_service

    def observe_replaced(self, node: int, at_s: float) -> None:
        from argosy.health.policy import Evidence, EvidenceKind

        self._decide(node, Evidence(EvidenceKind.REPAIR, at_s, "replaced"))

    def _decide(self, node: int, evidence: Evidence) -> NodeRecord:
        from argosy.health.policy import NodeRecord, decide

        record = self.records.get(node) or NodeRecord(f"node-{node}")
        record, _ = decide(record, evidence, self.config)
        self.records[node] = record
        return record
