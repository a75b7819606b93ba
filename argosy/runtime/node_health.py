"""What a run says about its node: node-health evidence and the record, in node_health.json.

The runtime's verdicts count against the node its ranks ran on: straggler verdicts, and
crashes and hangs (repeated ones add up), plus the preflight check's verdict. A fault the
run injected itself (`--inject`) is marked `injected`: the run's own record counts it (so
the path can be tested), the control plane does not (a user's test says nothing of the
shared node). Which faults
count, and how evidence moves a node between healthy, cordoned and quarantined, is the
pure rule of `argosy.health.policy` (`runtime_evidence`, `replay`); this module only
reads the run's events and writes the record for the scheduler and server to take in.
Times are Unix seconds, so records of several runs of one node fold in order.

    data = node_health(events, node="host-3", config=NodePolicyConfig())
    write_json_atomic(run_dir / "node_health.json", data)
"""

from __future__ import annotations

from typing import Any

from argosy.health.config import NodePolicyConfig
from argosy.health.policy import Evidence, replay, runtime_evidence


def run_evidence(events: list[dict[str, Any]]) -> list[tuple[Evidence, dict[str, Any]]]:
    """Evidence about the node in a run's events, oldest first, each with where it came from."""
    start = next((e for e in events if e["event"] == "start"), {})
    t0 = float(start.get("started_unix", 0.0))
    found = []
    for e in events:
        at = t0 + float(e.get("t", 0.0))
        if e["event"] == "preflight":
            evidence = Evidence.check(e["verdict"], at, _preflight_detail(e))
            found.append((evidence, {"source": "preflight"}))
        elif e["event"] == "fault":
            evidence = runtime_evidence(e["kind"], at, e.get("detail") or "")
            if evidence is not None:
                where = {"source": "fault", "rank": e.get("rank")}
                where |= {"injected": True} if e.get("injected_at_s") else {}
                found.append((evidence, where))
    found.sort(key=lambda item: item[0].at_s)
    return found


def _preflight_detail(event: dict[str, Any]) -> str:
    bad = [f"device {x['device']}: {x['why']}" for x in event.get("excluded") or []]
    return "; ".join(bad + list(event.get("node_warnings") or []))


def node_health(
    events: list[dict[str, Any]], node: str, config: NodePolicyConfig
) -> dict[str, Any]:
    """The node's record after this run's evidence, its state changes, and the evidence."""
    found = run_evidence(events)
    record, changes = replay(node, [ev for ev, _ in found], config)
    last = record.last_s if found else 0.0
    return {
        "node": node,
        "record": record.to_json(),
        "score": record.score(last, config),
        "transitions": [c.to_json() for c in changes],
        "evidence": [
            {"kind": ev.kind.value, "at_s": round(ev.at_s, 3), "detail": ev.detail, **where}
            for ev, where in found
        ],
        "how": "run events -> argosy.health.policy.runtime_evidence -> replay (NodePolicyConfig)",
    }
