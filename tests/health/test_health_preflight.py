"""The preflight rule: which devices a launch uses, which it leaves out, when it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.health.preflight import choose_devices
from argosy.health.report import HealthReport, NodeInfo
from argosy.health.verdict import CheckResult, Verdict

H, D, F = Verdict.HEALTHY, Verdict.DEGRADED, Verdict.FAILED


def check(name: str, verdict: Verdict, factor: float | None = None) -> CheckResult:
    return CheckResult(name, 1.0, "x", 1.0, verdict, factor)


def report(per_device: list[list[Verdict]], bus: Verdict = H) -> HealthReport:
    """Device k gets the checks gemm.rank<k>, gemm_peer.rank<k>, ... with the given verdicts."""
    probes = ("gemm", "gemm_peer", "memory", "memory_peer")
    checks = [
        check(f"{probe}.rank{k}", v, 0.5 if v is not H else 1.0)
        for k, verdicts in enumerate(per_device)
        for probe, v in zip(probes, verdicts, strict=False)
    ]
    checks.append(check("bus", bus, 0.3))
    checks.append(CheckResult("vendor_signals", None, "", None, Verdict.NOT_APPLICABLE))
    info = NodeInfo("cpu", "cpu", len(per_device), "gloo", "test")
    return HealthReport(tuple(checks), info, 1.0)


CASES = {
    "all healthy: the first ones": ([[H], [H], [H]], 2, H, (0, 1), [], None),
    "a slow device left out": ([[H], [H, D], [H]], 2, H, (0, 2), [1], None),
    "too few healthy: refused": ([[H], [D], [F]], 2, H, (), [1, 2], "device 1"),
    "a degraded bus is only a warning": ([[H], [H]], 2, D, (0, 1), [], None),
    "a failed bus refuses the node": ([[H], [H]], 1, F, (), [], "bus failed"),
    "every device short of its reference, one slow to its peers": (
        [[D, H], [D, D]],
        1,
        H,
        (0,),
        [1],
        None,
    ),
    "one device short of its reference alone is left out": ([[D], [H]], 1, H, (1,), [0], None),
    "a failed absolute check still leaves its device out": ([[F], [D]], 1, H, (1,), [0], None),
    "a lone device short of its reference is left out": ([[D]], 1, H, (), [0], "device 0"),
}


@pytest.mark.parametrize(
    ("devices", "need", "bus", "want_use", "want_excluded", "want_refused"),
    list(CASES.values()),
    ids=list(CASES),
)
def test_choose_devices(devices, need, bus, want_use, want_excluded, want_refused) -> None:  # noqa: ANN001
    decision = choose_devices(report(devices, bus), need)
    assert decision.use == want_use
    assert [e["device"] for e in decision.excluded] == want_excluded
    if want_refused is None:
        assert decision.refused is None
    else:
        assert want_refused in decision.refused


def test_a_node_wide_shortfall_is_a_warning_naming_the_check() -> None:
    decision = choose_devices(report([[D, H], [D, D]]), need=1)
    assert any("every device gemm.rank0 degraded" in w for w in decision.node_warnings)
    assert "gemm.rank1" not in decision.excluded[0]["why"]  # only its peer check counts
    assert "gemm_peer.rank1" in decision.excluded[0]["why"]


def test_a_refusal_names_the_device_and_the_check_that_failed_it() -> None:
    decision = choose_devices(report([[H, H], [H, D]]), need=2)
    assert "device 1" in decision.refused and "gemm_peer.rank1 degraded x0.50" in decision.refused
    assert "--spares" in decision.refused


verdicts = st.lists(st.sampled_from([H, H, H, D, F]), min_size=1, max_size=4)


@given(
    devices=st.lists(verdicts, min_size=1, max_size=8),
    need=st.integers(1, 8),
    bus=st.sampled_from([H, D, F]),
)
def test_used_devices_are_healthy_distinct_and_enough_or_refused(devices, need, bus) -> None:  # noqa: ANN001
    decision = choose_devices(report(devices, bus), need)
    bad = {k for k, vs in enumerate(devices) if any(v is not H for v in vs)}
    # a probe every device falls short of (absolute check, index 0 and 2) is the node's:
    # its degraded checks single out nobody
    node_wide = [
        i
        for i in (0, 2)
        if len(devices) >= 2 and all(len(d) > i and d[i] is not H for d in devices)
    ]
    for k, vs in enumerate(devices):
        if k in bad and all(v is H or (i in node_wide and v is D) for i, v in enumerate(vs)):
            bad.discard(k)
    assert {e["device"] for e in decision.excluded} == bad
    if decision.refused is None:
        assert len(decision.use) == need == len(set(decision.use))
        assert not set(decision.use) & bad and bus is not F
        assert list(decision.use) == sorted(decision.use)
    else:
        assert decision.use == ()
        assert bus is F or len(devices) - len(bad) < need
