"""The node-record policy: table cases and hypothesis properties (monotone, repair, no flapping)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.health.config import NodePolicyConfig
from argosy.health.policy import (
    TRANSITIONS,
    Evidence,
    EvidenceKind,
    NodeRecord,
    NodeState,
    decide,
    replay,
    runtime_evidence,
)

CONFIG = NodePolicyConfig(window_s=1000.0, uncordon_after=3, probation_checks=2)
NEGATIVE = [
    EvidenceKind.CHECK_DEGRADED,
    EvidenceKind.CHECK_FAILED,
    EvidenceKind.STRAGGLER,
    EvidenceKind.FAULT,
]
GOOD = EvidenceKind.CHECK_HEALTHY


def timeline(kinds: list[EvidenceKind], step_s: float = 10.0) -> list[Evidence]:
    return [Evidence(kind, i * step_s) for i, kind in enumerate(kinds)]


def final(kinds: list[EvidenceKind], step_s: float = 10.0) -> NodeState:
    return replay("n", timeline(kinds, step_s), CONFIG)[0].state


D, F, S, X, R = (
    EvidenceKind.CHECK_DEGRADED,
    EvidenceKind.CHECK_FAILED,
    EvidenceKind.STRAGGLER,
    EvidenceKind.FAULT,
    EvidenceKind.REPAIR,
)


@pytest.mark.parametrize(
    ("kinds", "want"),
    [
        ([GOOD, GOOD], NodeState.HEALTHY),
        ([D], NodeState.HEALTHY),
        ([D, S], NodeState.CORDONED),
        ([D, S, GOOD, GOOD], NodeState.CORDONED),
        ([D, S, GOOD, GOOD, GOOD], NodeState.CORDONED),  # score still 2 within the window
        ([F], NodeState.QUARANTINED),
        ([X, X, X, X], NodeState.QUARANTINED),
        ([F, GOOD, GOOD, GOOD, GOOD], NodeState.QUARANTINED),
        ([F, R], NodeState.REPAIRED),
        ([F, R, GOOD, GOOD], NodeState.HEALTHY),
        ([F, R, D, S], NodeState.QUARANTINED),  # relapse on probation
        ([F, R, GOOD, GOOD, D, S], NodeState.CORDONED),  # after probation: ordinary again
    ],
    ids=[
        "clean",
        "one-blip",
        "cordon",
        "cordon-holds",
        "cordon-in-window",
        "failed-check",
        "repeated-faults",
        "quarantine-sticks",
        "repaired",
        "probation-done",
        "relapse",
        "healthy-after-probation",
    ],
)
def test_policy_table(kinds: list[EvidenceKind], want: NodeState) -> None:
    assert final(kinds) is want


def test_a_cordoned_node_returns_once_its_evidence_ages_out() -> None:
    evidence = [Evidence(D, 0.0), Evidence(S, 1.0)] + [Evidence(GOOD, 1001.0 + i) for i in range(3)]
    record, changes = replay("n", evidence, CONFIG)
    assert record.state is NodeState.HEALTHY
    assert [(c.before, c.after) for c in changes] == [
        (NodeState.HEALTHY, NodeState.CORDONED),
        (NodeState.CORDONED, NodeState.HEALTHY),
    ]
    assert changes[0].reason == "straggler"


def test_bad_input_is_refused() -> None:
    record, _ = decide(NodeRecord("n"), Evidence(GOOD, 5.0), CONFIG)
    with pytest.raises(ValueError, match="out of order"):
        decide(record, Evidence(GOOD, 4.0), CONFIG)
    with pytest.raises(ValueError, match="unknown check verdict"):
        Evidence.check("sick", 0.0)
    assert Evidence.check("not_applicable", 0.0).kind is GOOD


kinds_st = st.lists(st.sampled_from([*NEGATIVE, GOOD, GOOD, EvidenceKind.REPAIR]), max_size=30)
steps_st = st.floats(0.0, 400.0)


@settings(max_examples=300, deadline=None)
@given(kinds=kinds_st, step_s=steps_st, where=st.integers(0, 30), extra=st.sampled_from(NEGATIVE))
def test_more_negative_evidence_never_leaves_a_node_better(
    kinds: list[EvidenceKind], step_s: float, where: int, extra: EvidenceKind
) -> None:
    base = timeline(kinds, step_s)
    where = min(where, len(base))
    at = base[where - 1].at_s if where else 0.0
    more = [*base[:where], Evidence(extra, at), *base[where:]]
    got_base = replay("n", base, CONFIG)[0].state
    got_more = replay("n", more, CONFIG)[0].state
    assert got_more.rank >= got_base.rank, (got_base, got_more)


@settings(max_examples=200, deadline=None)
@given(history=kinds_st, step_s=steps_st)
def test_a_repaired_node_returns_to_service(history: list[EvidenceKind], step_s: float) -> None:
    kinds = [*history, EvidenceKind.REPAIR] + [GOOD] * CONFIG.probation_checks
    records = []
    record = NodeRecord("n")
    for item in timeline(kinds, step_s):
        record, change = decide(record, item, CONFIG)
        records.append(record)
        if change is not None:
            assert change.after in TRANSITIONS[change.before]
    after_repair = records[len(history) :]
    assert all(r.state.in_service for r in after_repair)
    assert after_repair[-1].state is NodeState.HEALTHY


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(
        st.tuples(st.sampled_from(NEGATIVE), st.integers(0, CONFIG.uncordon_after - 1)),
        min_size=1,
        max_size=15,
    ),
    step_s=st.floats(0.0, 100.0),
)
def test_alternating_evidence_does_not_flap(
    runs: list[tuple[EvidenceKind, int]], step_s: float
) -> None:
    """Bad evidence between short runs of good checks: once out of service, never back."""
    kinds = [k for bad, good in runs for k in [bad, *[GOOD] * good]]
    _, changes = replay("n", timeline(kinds, step_s), CONFIG)
    assert all(not c.after.in_service for c in changes)
    assert len(changes) <= 2  # healthy -> cordoned -> quarantined at most


@settings(max_examples=200, deadline=None)
@given(before=kinds_st, after=st.lists(st.sampled_from([*NEGATIVE, GOOD]), max_size=20))
def test_a_failed_check_quarantines_until_repair(
    before: list[EvidenceKind], after: list[EvidenceKind]
) -> None:
    assert final([*before, EvidenceKind.CHECK_FAILED, *after]) is NodeState.QUARANTINED


def test_a_check_report_becomes_evidence_naming_what_failed_it() -> None:
    from argosy.health.report import HealthReport, NodeInfo
    from argosy.health.verdict import CheckResult, Verdict

    node = NodeInfo("cpu", "cpu", 2, "gloo", "test")
    slow = CheckResult("gemm_peer.rank1", 0.5, "x peers", 1.0, Verdict.DEGRADED, 0.5)
    ok = CheckResult("gemm_peer.rank0", 2.0, "x peers", 1.0, Verdict.HEALTHY, 2.0)
    evidence = Evidence.from_report(HealthReport((ok, slow), node, 1.0), at_s=7.0)
    assert evidence.kind is EvidenceKind.CHECK_DEGRADED and evidence.at_s == 7.0
    assert evidence.detail == "gemm_peer.rank1 x0.5"
    healthy = Evidence.from_report(HealthReport((ok,), node, 1.0), at_s=8.0)
    assert healthy.kind is EvidenceKind.CHECK_HEALTHY and healthy.detail == ""


RUNTIME_KINDS = ["crash", "hang", "straggler", "exit", "interrupted"]


@given(
    kinds=st.lists(st.sampled_from(RUNTIME_KINDS), max_size=12),
    extra=st.sampled_from(RUNTIME_KINDS),
)
def test_runtime_faults_count_only_when_they_point_at_the_node(
    kinds: list[str], extra: str
) -> None:
    def fold(seq: list[str]) -> NodeRecord:
        found = [runtime_evidence(k, float(i), k) for i, k in enumerate(seq)]
        return replay("n", [e for e in found if e is not None], CONFIG)[0]

    before, after = fold(kinds), fold([*kinds, extra])
    assert after.state.rank >= before.state.rank  # one more fault never helps
    if extra in ("exit", "interrupted"):  # the script's own error, or nobody's
        assert after == before
    else:
        assert len(after.marks) == len(before.marks) + 1
    counted = sum(k in ("crash", "hang", "straggler") for k in [*kinds, extra])
    if counted * 1.0 >= CONFIG.cordon_score:  # repeated faults take the node out of service
        assert not after.state.in_service


@given(history=kinds_st, step_s=steps_st)
def test_records_round_trip_through_json(history: list[EvidenceKind], step_s: float) -> None:
    record, changes = replay("node-7", timeline(history, step_s), CONFIG)
    assert NodeRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    for change in changes:
        assert change.to_json()["after"] in {s.value for s in NodeState}
