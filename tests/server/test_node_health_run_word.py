"""A job's own node_health.json cannot take its node out of service for the window: one
entry an attempt, weighing under `cordon_score`, and operators' healthy checks bring back
a node that only runs' word keeps out."""

from __future__ import annotations

import time
from pathlib import Path

from argosy.health.config import NodePolicyConfig
from argosy.health.policy import NodeState
from argosy.server.node_health import NodeHealth
from argosy.server.store import Store


def _health(tmp_path: Path) -> NodeHealth:
    return NodeHealth(Store(f"sqlite:///{tmp_path / 'db.sqlite'}"), NodePolicyConfig())


def _attempt(health: NodeHealth, node: str, entries: list[dict], job: str = "j1") -> None:
    now = time.time()
    health.absorb_run(node, entries, since_s=now - 10, until_s=now, job_id=job)


def _failed(n: int) -> list[dict]:
    now = time.time()
    return [{"kind": "check_failed", "at_s": now - 5, "detail": f"gemm {i}"} for i in range(n)]


def test_many_check_failed_entries_of_one_attempt_do_not_cordon(tmp_path: Path) -> None:
    health = _health(tmp_path)
    _attempt(health, "vm", _failed(16))
    record = health.record("vm")
    assert record.state is NodeState.HEALTHY and record.state.in_service
    assert len(record.marks) == 1
    assert record.score(time.time(), health.config) < health.config.cordon_score
    assert len(health.history("vm")) == 1


def test_runs_alone_cordon_at_most_and_healthy_checks_bring_the_node_back(
    tmp_path: Path,
) -> None:
    health = _health(tmp_path)
    for job in ("j1", "j2", "j3", "j4"):
        _attempt(health, "vm", _failed(16), job)
    assert health.record("vm").state is NodeState.CORDONED  # never quarantined
    for _ in range(health.config.uncordon_after):
        record, _ = health.report("vm", "healthy", "ok", actor="admin")
    assert record.state is NodeState.HEALTHY, record
    reopened = NodeHealth(health.store, health.config)  # a restarted server agrees
    assert reopened.record("vm").state is NodeState.HEALTHY


def test_an_operators_own_evidence_still_keeps_the_node_out(tmp_path: Path) -> None:
    health = _health(tmp_path)
    health.report("vm", "degraded", "slow", actor="admin")
    health.report("vm", "degraded", "slow", actor="admin")
    assert health.record("vm").state is NodeState.CORDONED
    for _ in range(health.config.uncordon_after):
        record, _ = health.report("vm", "healthy", "ok", actor="admin")
    assert record.state is NodeState.CORDONED  # the operators' score is still >= cordon


def test_run_marks_survive_a_restart(tmp_path: Path) -> None:
    health = _health(tmp_path)
    for job in ("j1", "j2"):
        _attempt(health, "vm", _failed(3), job)
    assert health.record("vm").state is NodeState.CORDONED
    reopened = NodeHealth(health.store, health.config)
    for _ in range(health.config.uncordon_after):
        record, _ = reopened.report("vm", "healthy", "ok", actor="admin")
    assert record.state is NodeState.HEALTHY
