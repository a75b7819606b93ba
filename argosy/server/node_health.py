"""The health feed: verdicts about nodes in, the health layer's node-record policy applied.

A verdict (a health check's `healthy`/`degraded`/`failed`, a runtime `straggler` or
`fault`, an operator's `repair`) becomes `argosy.health.policy.Evidence`; `decide` folds
it into the node's `NodeRecord`, which is stored with the evidence. A node whose record
is not in service (cordoned or quarantined by the policy) leaves placement until the
policy lets it back (healthy checks, or a repair); what runs there keeps running. This
is apart from an operator's cordon: either one keeps new work off the node.

    health = NodeHealth(store, NodePolicyConfig())
    record, change = health.report("n0", "failed", "gemm x0.31")   # change: healthy -> quarantined
"""

from __future__ import annotations

import time

from argosy.health.config import NodePolicyConfig
from argosy.health.policy import Evidence, EvidenceKind, NodeRecord, Transition, decide
from argosy.server.store import SYSTEM_ACTOR, Row, Store

VERDICTS: dict[str, EvidenceKind] = {
    "healthy": EvidenceKind.CHECK_HEALTHY,
    "not_applicable": EvidenceKind.CHECK_HEALTHY,
    "degraded": EvidenceKind.CHECK_DEGRADED,
    "failed": EvidenceKind.CHECK_FAILED,
    "straggler": EvidenceKind.STRAGGLER,
    "fault": EvidenceKind.FAULT,
    "repair": EvidenceKind.REPAIR,
}
"""Verdicts the feed takes, and the evidence each one is."""


class NodeHealth:
    """Each node's policy record, kept in the store."""

    def __init__(self, store: Store, config: NodePolicyConfig) -> None:
        self.store = store
        self.config = config
        self.records = {
            name: NodeRecord.from_json(data) for name, data in store.health_records().items()
        }

    def out_of_service(self) -> set[str]:
        """Nodes the policy keeps out of placement."""
        return {name for name, r in self.records.items() if not r.state.in_service}

    def record(self, node: str) -> NodeRecord:
        return self.records.get(node) or NodeRecord(node)

    def report(
        self, node: str, verdict: str, detail: str, *, actor: str = SYSTEM_ACTOR
    ) -> tuple[NodeRecord, Transition | None]:
        """Apply one verdict (reported by `actor`) to the node's record and store both."""
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict '{verdict}'; known: {', '.join(VERDICTS)}")
        return self._apply(node, VERDICTS[verdict], time.time(), detail, verdict, actor)

    def absorb_run(self, node: str, entries: list[dict]) -> None:
        """Apply the evidence a run wrote about its node (`node_health.json`'s `evidence`:
        crashes, hangs, stragglers, the preflight verdict); unknown kinds are skipped."""
        for entry in entries:
            try:
                kind = EvidenceKind(entry["kind"])
                at_s = float(entry["at_s"])
            except (KeyError, TypeError, ValueError):
                continue
            self._apply(node, kind, at_s, str(entry.get("detail") or ""), f"run {kind.value}")

    def _apply(
        self,
        node: str,
        kind: EvidenceKind,
        at_s: float,
        detail: str,
        label: str,
        actor: str = SYSTEM_ACTOR,
    ) -> tuple[NodeRecord, Transition | None]:
        before = self.record(node)
        at_s = max(at_s, before.last_s)  # the policy wants evidence in order
        record, change = decide(before, Evidence(kind, at_s, detail), self.config)
        evidence = {"kind": label, "detail": detail, "state": record.state.value}
        event = None
        if change is not None:
            why = f"node {node} {change.before.value} -> {change.after.value}: {change.reason}"
            event = ("node_health", why)
        self.store.save_health(node, record.to_json(), evidence, event, actor=actor)
        self.records[node] = record
        return record, change

    def history(self, node: str, limit: int = 100) -> list[Row]:
        return self.store.health_history(node, limit)
