"""The node-record policy: evidence about a node in, its service state out. Pure.

Evidence is a health-check verdict, a runtime straggler verdict, a fault the runtime
pinned on the node, or an operator's repair. Negative evidence carries a weight; the
node's score is the weight seen within `window_s`. The states, as data:

    HEALTHY      in service
    CORDONED     out of service: no new work; returns after `uncordon_after` healthy checks
    QUARANTINED  out of service until repaired, whatever else is seen
    REPAIRED     in service on probation; healthy after `probation_checks` healthy checks,
                 straight back to QUARANTINED if it relapses (score >= cordon_score)

Runtime faults become evidence through `runtime_evidence` (crashes, hangs and straggler
verdicts count; a script's own error exit does not). Records round-trip through
`to_json`/`from_json`, the format of a run's node_health.json.

Properties the tests hold it to: more negative evidence never leaves a node in a better
state (monotone); a repaired node is in service and returns to HEALTHY after its probation;
alternating good and bad evidence cannot flap a node in and out of service.

    record = NodeRecord("node-7")
    record, change = decide(record, Evidence.check("degraded", at_s=10.0), NodePolicyConfig())
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from argosy.health.config import NodePolicyConfig
from argosy.health.report import HealthReport
from argosy.health.verdict import Verdict


class NodeState(enum.Enum):
    """Service state of a node; `rank` orders them from best to worst."""

    HEALTHY = "healthy"
    REPAIRED = "repaired"
    CORDONED = "cordoned"
    QUARANTINED = "quarantined"

    @property
    def in_service(self) -> bool:
        """May the scheduler place new work on the node?"""
        return self in (NodeState.HEALTHY, NodeState.REPAIRED)

    @property
    def rank(self) -> int:
        return list(NodeState).index(self)


TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.HEALTHY: frozenset({NodeState.CORDONED, NodeState.QUARANTINED, NodeState.REPAIRED}),
    NodeState.CORDONED: frozenset({NodeState.HEALTHY, NodeState.QUARANTINED, NodeState.REPAIRED}),
    NodeState.QUARANTINED: frozenset({NodeState.REPAIRED}),
    NodeState.REPAIRED: frozenset({NodeState.HEALTHY, NodeState.QUARANTINED}),
}
"""Legal state changes; anything else is a bug and raises."""


class EvidenceKind(enum.Enum):
    """What was seen about a node."""

    CHECK_HEALTHY = "check_healthy"
    CHECK_DEGRADED = "check_degraded"
    CHECK_FAILED = "check_failed"
    STRAGGLER = "straggler"
    FAULT = "fault"
    REPAIR = "repair"


@dataclass(frozen=True)
class Evidence:
    """One observation about a node at time `at_s` (any monotonic clock, seconds)."""

    kind: EvidenceKind
    at_s: float
    detail: str = ""

    @classmethod
    def check(cls, verdict: str, at_s: float, detail: str = "") -> Evidence:
        """A health-check verdict: healthy, degraded or failed (not_applicable is healthy)."""
        kinds = {
            "healthy": EvidenceKind.CHECK_HEALTHY,
            "not_applicable": EvidenceKind.CHECK_HEALTHY,
            "degraded": EvidenceKind.CHECK_DEGRADED,
            "failed": EvidenceKind.CHECK_FAILED,
        }
        if verdict not in kinds:
            raise ValueError(f"unknown check verdict '{verdict}'; known: {sorted(kinds)}")
        return cls(kinds[verdict], at_s, detail)

    @classmethod
    def from_report(cls, report: HealthReport, at_s: float) -> Evidence:
        """The evidence of a whole node check: its verdict, naming the checks that failed it."""
        bad = [
            f"{c.name} x{c.factor:g}" if c.factor is not None else c.name
            for c in report.checks
            if c.verdict in (Verdict.DEGRADED, Verdict.FAILED)
        ]
        return cls.check(report.verdict.value, at_s, ", ".join(bad))

    def weight(self, config: NodePolicyConfig) -> float:
        """How much this counts against the node (0 for healthy checks and repairs)."""
        return {
            EvidenceKind.CHECK_DEGRADED: config.degraded_weight,
            EvidenceKind.CHECK_FAILED: config.failed_weight,
            EvidenceKind.STRAGGLER: config.straggler_weight,
            EvidenceKind.FAULT: config.fault_weight,
        }.get(self.kind, 0.0)


@dataclass(frozen=True)
class NodeRecord:
    """What the policy remembers about one node."""

    node: str
    state: NodeState = NodeState.HEALTHY
    marks: tuple[tuple[float, float], ...] = ()
    """(time, weight) of negative evidence since the last repair, oldest first."""
    healthy_streak: int = 0
    """Healthy checks since the last negative evidence or repair."""
    last_s: float = float("-inf")

    def score(self, now_s: float, config: NodePolicyConfig) -> float:
        """Weight of the negative evidence within the window ending at `now_s`."""
        return sum(w for at, w in self.marks if at > now_s - config.window_s)

    def to_json(self) -> dict[str, Any]:
        """The record as stored (node_health.json, the server): `from_json` reads it back."""
        return {
            "node": self.node,
            "state": self.state.value,
            "in_service": self.state.in_service,
            "marks": [list(m) for m in self.marks],
            "healthy_streak": self.healthy_streak,
            "last_s": None if self.last_s == float("-inf") else self.last_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeRecord:
        last = data.get("last_s")
        return cls(
            node=str(data["node"]),
            state=NodeState(data["state"]),
            marks=tuple((float(at), float(w)) for at, w in data.get("marks", ())),
            healthy_streak=int(data.get("healthy_streak", 0)),
            last_s=float("-inf") if last is None else float(last),
        )


@dataclass(frozen=True)
class Transition:
    """A change of a node's state, with the evidence that caused it."""

    node: str
    before: NodeState
    after: NodeState
    at_s: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "before": self.before.value,
            "after": self.after.value,
            "at_s": self.at_s,
            "reason": self.reason,
        }


RUNTIME_FAULTS_AGAINST_NODE = frozenset({"crash", "hang", "straggler"})
"""Runtime fault kinds that count against the node the rank ran on. A rank killed by a
signal or hung in a collective points at the machine; a script that exits with an error
code (`exit`) points at the script, and an interrupted launch at nobody."""


def runtime_evidence(kind: str, at_s: float, detail: str = "") -> Evidence | None:
    """The evidence a runtime fault of `kind` gives about its node (None: it gives none).

    A straggler verdict is STRAGGLER evidence; a crash or hang is FAULT evidence, so the
    repeated faults of one node add up in its score until it is cordoned.
    """
    if kind not in RUNTIME_FAULTS_AGAINST_NODE:
        return None
    evidence_kind = EvidenceKind.STRAGGLER if kind == "straggler" else EvidenceKind.FAULT
    return Evidence(evidence_kind, at_s, detail)


def decide(
    record: NodeRecord, evidence: Evidence, config: NodePolicyConfig
) -> tuple[NodeRecord, Transition | None]:
    """The node's record after `evidence`, and the state change it caused (if any)."""
    if evidence.at_s < record.last_s:
        raise ValueError(
            f"evidence for {record.node} out of order: {evidence.at_s} < {record.last_s}"
        )
    # 1. forget what fell out of the window
    horizon = evidence.at_s - config.window_s
    record = replace(
        record, marks=tuple(m for m in record.marks if m[0] > horizon), last_s=evidence.at_s
    )
    # 2. apply the evidence
    if evidence.kind is EvidenceKind.REPAIR:
        updated, target = replace(record, marks=(), healthy_streak=0), NodeState.REPAIRED
    elif evidence.kind is EvidenceKind.CHECK_HEALTHY:
        updated = replace(record, healthy_streak=record.healthy_streak + 1)
        target = _after_good(updated, evidence.at_s, config)
    else:
        weight = evidence.weight(config)
        updated = replace(record, marks=(*record.marks, (evidence.at_s, weight)), healthy_streak=0)
        target = _after_bad(updated, evidence.at_s, config)
    # 3. move, through the transition table
    if target is record.state:
        return updated, None
    assert target in TRANSITIONS[record.state], (record.state, target)
    change = Transition(record.node, record.state, target, evidence.at_s, _reason(evidence))
    return replace(updated, state=target), change


def replay(
    node: str, evidence: list[Evidence], config: NodePolicyConfig
) -> tuple[NodeRecord, list[Transition]]:
    """Fold a node's evidence from a fresh record; the final record and every change."""
    record, changes = NodeRecord(node), []
    for item in evidence:
        record, change = decide(record, item, config)
        if change is not None:
            changes.append(change)
    return record, changes


def _after_good(record: NodeRecord, now_s: float, config: NodePolicyConfig) -> NodeState:
    streak, state = record.healthy_streak, record.state
    if state is NodeState.REPAIRED and streak >= config.probation_checks:
        return NodeState.HEALTHY
    if (
        state is NodeState.CORDONED
        and streak >= config.uncordon_after
        and record.score(now_s, config) < config.cordon_score
    ):
        return NodeState.HEALTHY
    return state


def _after_bad(record: NodeRecord, now_s: float, config: NodePolicyConfig) -> NodeState:
    score, state = record.score(now_s, config), record.state
    if state is NodeState.QUARANTINED:
        return state
    if score >= config.quarantine_score:
        return NodeState.QUARANTINED
    if score >= config.cordon_score:
        # a repaired node that relapses goes straight back to quarantine
        return NodeState.QUARANTINED if state is NodeState.REPAIRED else NodeState.CORDONED
    return state


def _reason(evidence: Evidence) -> str:
    text = evidence.kind.value.replace("_", " ")
    return f"{text}: {evidence.detail}" if evidence.detail else text
