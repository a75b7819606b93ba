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
recovery.py`). `argosy sim run` passes the health layer's node-record policy
(`argosy.health.policy`) from the composition root; `NoIsolation` keeps every node in
service (the baseline for "what does isolation buy").
"""

from __future__ import annotations

from typing import Protocol


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
