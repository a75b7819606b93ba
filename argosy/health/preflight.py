"""Preflight: which of this node's devices a launch may use, from a node check. Pure.

A device is judged by the checks that name it (`<probe>.rank<k>`, `<probe>_peer.rank<k>`,
and its vendor signals `<signal>.dev<k>`: a power cap, thermal throttle or slowdown names
the device, with the vendor's reason): any degraded or failed one leaves it out, with one
exception: when *every* device of a node with two or more falls short of the same absolute
expectation or shows the same degraded signal, the shortfall is the node's, not a
device's. Those degraded checks become node warnings, as outside load on a shared machine
(or a hot room) slows every device alike; the peer checks (measured in the same rounds, so
load cancels) still single out the slow device, and a failed check still leaves its device
out. A failed vendor signal (uncorrectable ECC, critical XID) or a failed node-wide check
(`bus`) refuses the whole node; a degraded node-wide one is recorded and the launch goes
on. Signal device k is NVML's GPU k, the rank's device where CUDA orders GPUs as NVML does
(PCI bus order, `CUDA_DEVICE_ORDER=PCI_BUS_ID`, the usual case on nodes of one chip). The launch
needs `need` devices; the healthy ones are used in index order; with too few, it is
refused with a message that names each bad device and the check that failed it.

    decision = choose_devices(report, need=2)
    decision.use, decision.excluded, decision.refused
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from argosy.health.report import HealthReport
from argosy.health.verdict import CheckResult, Verdict

_DEVICE_CHECK = re.compile(r"^(?P<probe>\w+?)(?:_peer)?\.(?:rank|dev)(?P<rank>\d+)$")
_SIGNAL_CHECK = re.compile(r"\.dev\d+$")
_BAD = (Verdict.DEGRADED, Verdict.FAILED)


@dataclass(frozen=True)
class PreflightDecision:
    """The devices to use, those left out (with why), and a refusal message (or None)."""

    use: tuple[int, ...]
    excluded: tuple[dict[str, Any], ...]
    refused: str | None
    node_warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "use": list(self.use),
            "excluded": list(self.excluded),
            "refused": self.refused,
            "node_warnings": list(self.node_warnings),
        }


def _describe(check: CheckResult) -> str:
    factor = f" x{check.factor:.2f}" if check.factor is not None else ""
    why = f" ({check.detail})" if _SIGNAL_CHECK.search(check.name) and check.detail else ""
    return f"{check.name} {check.verdict.value}{factor}{why}"


def node_wide_shortfalls(checks: tuple[CheckResult, ...], num_devices: int) -> set[str]:
    """Absolute probes (`gemm`, `memory`, ...) that every device of the node falls short of.

    Needs two or more devices: with one, nothing tells the node from its device.
    """
    if num_devices < 2:
        return set()
    short: dict[str, set[int]] = {}
    for check in checks:
        match = _DEVICE_CHECK.match(check.name)
        if match and "_peer." not in check.name and check.verdict in _BAD:
            short.setdefault(match["probe"], set()).add(int(match["rank"]))
    return {probe for probe, ranks in short.items() if ranks >= set(range(num_devices))}


def _node_wide(check: CheckResult, probes: set[str]) -> bool:
    """A degraded absolute check whose probe every device of the node falls short of."""
    match = _DEVICE_CHECK.match(check.name)
    return (
        match is not None
        and "_peer." not in check.name
        and match["probe"] in probes
        and check.verdict is Verdict.DEGRADED
    )


def device_problems(
    checks: tuple[CheckResult, ...], num_devices: int | None = None
) -> dict[int, list[str]]:
    """Device index -> the degraded or failed checks that single it out.

    With `num_devices`, degraded absolute checks that every device shares are left out
    (they are the node's: see `node_wide_shortfalls`).
    """
    shared = node_wide_shortfalls(checks, num_devices) if num_devices else set()
    problems: dict[int, list[str]] = {}
    for check in checks:
        match = _DEVICE_CHECK.match(check.name)
        if match and check.verdict in _BAD and not _node_wide(check, shared):
            problems.setdefault(int(match["rank"]), []).append(_describe(check))
    return problems


def choose_devices(report: HealthReport, need: int) -> PreflightDecision:
    """The first `need` healthy devices of the node, or a refusal naming what failed."""
    if need < 1:
        raise ValueError(f"need must be at least 1, got {need}")
    node_checks = [c for c in report.checks if not _DEVICE_CHECK.match(c.name)]
    signals = [c for c in report.checks if _SIGNAL_CHECK.search(c.name)]
    node_failed = [_describe(c) for c in node_checks + signals if c.verdict is Verdict.FAILED]
    shared = node_wide_shortfalls(report.checks, report.node.num_ranks)
    warnings = tuple(_describe(c) for c in node_checks if c.verdict is Verdict.DEGRADED)
    warnings += tuple(
        f"every device {_describe(c)} (the node's, not the device's)"
        for c in report.checks
        if _node_wide(c, shared)
    )
    problems = device_problems(report.checks, report.node.num_ranks)
    excluded = tuple({"device": d, "why": "; ".join(why)} for d, why in sorted(problems.items()))
    healthy = [d for d in range(report.node.num_ranks) if d not in problems]
    if node_failed:
        refused = f"the node failed its health check: {'; '.join(node_failed)}"
        return PreflightDecision((), excluded, refused, warnings)
    if len(healthy) < need:
        bad = "; ".join(f"device {e['device']}: {e['why']}" for e in excluded)
        refused = (
            f"{need} healthy device(s) needed, {len(healthy)} of {report.node.num_ranks} "
            f"passed the health check ({bad}); add spares with --spares or fix the node"
        )
        return PreflightDecision((), excluded, refused, warnings)
    return PreflightDecision(tuple(healthy[:need]), excluded, None, warnings)
