"""The health feed: verdicts about nodes in, the health layer's node-record policy applied.

A verdict (a health check's `healthy`/`degraded`/`failed`, a runtime `straggler` or
`fault`, an operator's `repair`) becomes `argosy.health.policy.Evidence`; `decide` folds
it into the node's `NodeRecord`, which is stored with the evidence. A node whose record
is not in service (cordoned or quarantined by the policy) leaves placement until the
policy lets it back (healthy checks, or a repair); what runs there keeps running. This
is apart from an operator's cordon: either one keeps new work off the node.

What a run says about its node (`absorb_run`) is written by the job, as the job's user:
it is taken as the job's word, within bounds. Only evidence against the node counts
(faults, stragglers, failed or degraded checks: never a repair or a healthy check, which
would let a job bring back a node an operator took out), at most `MAX_RUN_EVIDENCE`
entries a run, each dated within the attempt (a time outside it, or not a finite number,
is clamped or skipped), its detail cut to `MAX_DETAIL` characters and naming the job.
And a run's word alone cordons a node at most: it never quarantines one (a job could
otherwise take every node it lands on out of service until an operator's repair); a
cordoned node returns after healthy checks, and an operator sees which job reported what.

    health = NodeHealth(store, NodePolicyConfig())
    record, change = health.report("n0", "failed", "gemm x0.31")   # change: healthy -> quarantined
"""

from __future__ import annotations

import time
from dataclasses import replace

from argosy.health.config import NodePolicyConfig
from argosy.health.policy import (
    Evidence,
    EvidenceKind,
    NodeRecord,
    NodeState,
    Transition,
    decide,
)
from argosy.server.job_json import clip_text, number
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
RUN_KINDS = frozenset(
    {
        EvidenceKind.FAULT,
        EvidenceKind.STRAGGLER,
        EvidenceKind.CHECK_FAILED,
        EvidenceKind.CHECK_DEGRADED,
    }
)
"""What a run may say about its node: evidence against it only."""
MAX_RUN_EVIDENCE = 16
"""Entries of one run's node_health.json taken (a crash loop's restarts fit)."""
MAX_DETAIL = 300


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

    def absorb_run(
        self, node: str, entries: object, *, since_s: float, until_s: float, job_id: str = ""
    ) -> None:
        """Apply the evidence a run wrote about its node (`node_health.json`'s `evidence`:
        crashes, hangs, stragglers, the preflight verdict), within the bounds of the module
        docstring: the attempt ran from `since_s` to `until_s` (Unix seconds)."""
        if not isinstance(entries, list):
            return
        taken = 0
        for entry in entries:
            if taken >= MAX_RUN_EVIDENCE:
                break
            if not isinstance(entry, dict) or entry.get("kind") not in _RUN_KIND_NAMES:
                continue
            if entry.get("injected") is True:  # the job's own test fault, not the node's
                continue
            at_s = number(entry.get("at_s"))
            if at_s is None:
                continue
            kind = EvidenceKind(entry["kind"])
            detail = clip_text(entry.get("detail"), MAX_DETAIL)
            detail = f"{detail} (reported by job {job_id})" if job_id else detail
            at_s = min(max(at_s, since_s), until_s)
            self._apply(node, kind, at_s, detail, f"run {kind.value}", cap=NodeState.CORDONED)
            taken += 1

    def _apply(
        self,
        node: str,
        kind: EvidenceKind,
        at_s: float,
        detail: str,
        label: str,
        actor: str = SYSTEM_ACTOR,
        cap: NodeState | None = None,
    ) -> tuple[NodeRecord, Transition | None]:
        before = self.record(node)
        at_s = max(at_s, before.last_s)  # the policy wants evidence in order
        record, change = decide(before, Evidence(kind, at_s, detail), self.config)
        if cap is not None:
            record, change = _capped(before, record, change, cap)
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


_RUN_KIND_NAMES = frozenset(kind.value for kind in RUN_KINDS)


def _capped(
    before: NodeRecord, record: NodeRecord, change: Transition | None, cap: NodeState
) -> tuple[NodeRecord, Transition | None]:
    """`record` held at `cap` when the evidence would take the node past it from a state
    at or under it (a node on probation that relapses is quarantined as the policy says:
    the transition table has no way from repaired to cordoned)."""
    if change is None or record.state.rank <= cap.rank or before.state.rank > cap.rank:
        return record, change
    if before.state is NodeState.REPAIRED:
        return record, change
    held = replace(record, state=cap)
    if before.state is cap:
        return held, None
    reason = f"{change.reason} (a run's own report: cordoned at most)"
    return held, replace(change, after=cap, reason=reason)
