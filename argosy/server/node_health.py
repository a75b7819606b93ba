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
would let a job bring back a node an operator took out), one entry an attempt (its
heaviest, of the first `MAX_RUN_EVIDENCE` read) weighing at most `RUN_SHARE` of
`cordon_score`, so that one attempt alone never cordons its node (a crash loop's
restarts still do), dated within the attempt (a time outside it, or not a finite
number, is clamped or skipped), its detail cut to `MAX_DETAIL` characters and naming the
job. And a run's word alone cordons a node at most: it never quarantines one (a job could
otherwise take every node it lands on out of service until an operator's repair); a
cordoned node returns after `uncordon_after` healthy checks whenever what is left against
it without the runs' word (`run_marks`, kept with the record) is under `cordon_score`,
and an operator sees which job reported what.

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
"""Entries of one run's node_health.json read (the heaviest of them counts)."""
RUN_SHARE = 0.5
"""The most one attempt's word weighs, as a share of `cordon_score` (under 1: one attempt
alone never cordons its node)."""
RUN_MARKS = "run_marks"
"""The stored record's key of the marks that came from runs' own word."""
MAX_DETAIL = 300


class NodeHealth:
    """Each node's policy record, kept in the store."""

    def __init__(self, store: Store, config: NodePolicyConfig) -> None:
        self.store = store
        self.config = config
        stored = store.health_records()
        self.records = {name: NodeRecord.from_json(data) for name, data in stored.items()}
        self.run_marks: dict[str, set[tuple[float, float]]] = {
            name: _marks(data.get(RUN_MARKS)) for name, data in stored.items()
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
        kind = VERDICTS[verdict]
        if kind is EvidenceKind.CHECK_HEALTHY and self._run_word_only(node):
            return self._return_to_service(node, time.time(), detail, verdict, actor)
        return self._apply(node, kind, time.time(), detail, verdict, actor)

    def _run_word_only(self, node: str) -> bool:
        """Whether the node is cordoned, one more healthy check completes its streak, and
        what keeps it out beyond that is the runs' own word."""
        record = self.record(node)
        if record.state is not NodeState.CORDONED:
            return False
        if record.healthy_streak + 1 < self.config.uncordon_after:
            return False
        runs = self.run_marks.get(node, set())
        own = [m for m in record.marks if m not in runs]
        horizon = time.time() - self.config.window_s
        return sum(w for at, w in own if at > horizon) < self.config.cordon_score

    def _return_to_service(
        self, node: str, at_s: float, detail: str, label: str, actor: str
    ) -> tuple[NodeRecord, Transition | None]:
        """The healthy check that brings back a node only runs' word kept out: their
        marks go, and the node is healthy."""
        before = self.record(node)
        runs = self.run_marks.pop(node, set())
        at_s = max(at_s, before.last_s)
        marks = tuple(m for m in before.marks if m not in runs)
        record = replace(
            before,
            state=NodeState.HEALTHY,
            marks=marks,
            healthy_streak=before.healthy_streak + 1,
            last_s=at_s,
        )
        reason = f"{self.config.uncordon_after} healthy checks; the rest was runs' own word"
        change = Transition(node, before.state, NodeState.HEALTHY, at_s, reason)
        self._save(node, record, change, {"kind": label, "detail": detail}, actor)
        return record, change

    def absorb_run(
        self, node: str, entries: object, *, since_s: float, until_s: float, job_id: str = ""
    ) -> None:
        """Apply the evidence a run wrote about its node (`node_health.json`'s `evidence`:
        crashes, hangs, stragglers, the preflight verdict), within the bounds of the module
        docstring: the attempt ran from `since_s` to `until_s` (Unix seconds)."""
        if not isinstance(entries, list):
            return
        found = [e for e in map(_run_entry, entries[:MAX_RUN_EVIDENCE]) if e is not None]
        if not found:
            return
        kind, at_s, text = max(found, key=lambda e: Evidence(e[0], 0.0).weight(self.config))
        detail = clip_text(text, MAX_DETAIL)
        detail = f"{detail} (reported by job {job_id})" if job_id else detail
        at_s = max(min(max(at_s, since_s), until_s), self.record(node).last_s)
        config = self._run_config()
        mark = (at_s, Evidence(kind, at_s).weight(config))
        self.run_marks.setdefault(node, set()).add(mark)  # kept once `decide` keeps it
        self._apply(
            node, kind, at_s, detail, f"run {kind.value}", cap=NodeState.CORDONED, config=config
        )

    def _run_config(self) -> NodePolicyConfig:
        """The policy with every kind of evidence a run may give weighing at most
        `RUN_SHARE` of `cordon_score`."""
        most = self.config.cordon_score * RUN_SHARE
        names = ("degraded_weight", "failed_weight", "straggler_weight", "fault_weight")
        return self.config.model_copy(update={n: min(getattr(self.config, n), most) for n in names})

    def _apply(
        self,
        node: str,
        kind: EvidenceKind,
        at_s: float,
        detail: str,
        label: str,
        actor: str = SYSTEM_ACTOR,
        cap: NodeState | None = None,
        config: NodePolicyConfig | None = None,
    ) -> tuple[NodeRecord, Transition | None]:
        before = self.record(node)
        at_s = max(at_s, before.last_s)  # the policy wants evidence in order
        record, change = decide(before, Evidence(kind, at_s, detail), config or self.config)
        if cap is not None:
            record, change = _capped(before, record, change, cap)
        self._save(node, record, change, {"kind": label, "detail": detail}, actor)
        return record, change

    def _save(
        self,
        node: str,
        record: NodeRecord,
        change: Transition | None,
        evidence: dict[str, str],
        actor: str,
    ) -> None:
        """Store the node's record (with its runs' marks still in it), the evidence and
        the event of a change of state."""
        evidence = evidence | {"state": record.state.value}
        event = None
        if change is not None:
            why = f"node {node} {change.before.value} -> {change.after.value}: {change.reason}"
            event = ("node_health", why)
        self.records[node] = record
        self.store.save_health(node, self._stored(node), evidence, event, actor=actor)

    def _stored(self, node: str) -> dict:
        """The record as stored: `NodeRecord.to_json` and the marks runs gave."""
        record = self.record(node)
        runs = self.run_marks.get(node, set()) & set(record.marks)  # the window moved on
        self.run_marks[node] = runs
        return record.to_json() | {RUN_MARKS: sorted([list(m) for m in runs])}

    def history(self, node: str, limit: int = 100) -> list[Row]:
        return self.store.health_history(node, limit)


_RUN_KIND_NAMES = frozenset(kind.value for kind in RUN_KINDS)


def _run_entry(entry: object) -> tuple[EvidenceKind, float, object] | None:
    """(kind, time, detail) of one entry of a run's evidence; None for one that does not
    count (not evidence against the node, the job's own injected fault, no time)."""
    if not isinstance(entry, dict) or entry.get("kind") not in _RUN_KIND_NAMES:
        return None
    if entry.get("injected") is True:  # the job's own test fault, not the node's
        return None
    at_s = number(entry.get("at_s"))
    if at_s is None:
        return None
    return EvidenceKind(entry["kind"]), at_s, entry.get("detail")


def _marks(data: object) -> set[tuple[float, float]]:
    """Stored marks ([time, weight] pairs) as a set; what cannot be read is skipped."""
    out = set()
    for item in data if isinstance(data, list) else ():
        try:
            at, weight = item
            out.add((float(at), float(weight)))
        except (TypeError, ValueError):
            continue
    return out


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
