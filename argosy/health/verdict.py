"""Verdicts of node checks: pure functions from measured figures to healthy/degraded/failed.

A check compares a measured `value` with an `expected` figure; `factor = value / expected`
(higher is better for every probe here). Below `degraded_below` the check is degraded,
below `failed_below` it is failed; a probe that cannot run on this node (a host-device copy
without an accelerator) is `not_applicable` and does not count against the node.

    judge("gemm.rank0", value=0.04, expected=0.085, unit="TFLOP/s", config=HealthConfig())
    # CheckResult(verdict=Verdict.DEGRADED, factor=0.47, ...)
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from argosy.health.config import HealthConfig


class Verdict(enum.Enum):
    """Outcome of one check, or of a node; `severity` orders them."""

    NOT_APPLICABLE = "not_applicable"
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {
    Verdict.NOT_APPLICABLE: 0,
    Verdict.HEALTHY: 0,
    Verdict.DEGRADED: 1,
    Verdict.FAILED: 2,
}


@dataclass(frozen=True)
class CheckResult:
    """One check: what was measured, what was expected, and the verdict."""

    name: str
    value: float | None
    unit: str
    expected: float | None
    verdict: Verdict
    factor: float | None = None
    """value / expected; None when nothing was measured."""
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        return data


def classify(factor: float, config: HealthConfig) -> Verdict:
    """Verdict for a measured/expected factor."""
    if factor < config.failed_below:
        return Verdict.FAILED
    if factor < config.degraded_below:
        return Verdict.DEGRADED
    return Verdict.HEALTHY


def judge(
    name: str, *, value: float, expected: float, unit: str, config: HealthConfig, detail: str = ""
) -> CheckResult:
    """Compare one measured figure with its expectation (higher is better)."""
    if expected <= 0:
        raise ValueError(f"check '{name}': expected must be positive, got {expected}")
    factor = round(value / expected, 3)  # the verdict follows the factor the report shows
    return CheckResult(
        name=name,
        value=_round(value),
        unit=unit,
        expected=_round(expected),
        verdict=classify(factor, config),
        factor=factor,
        detail=detail,
    )


def not_applicable(name: str, unit: str, reason: str) -> CheckResult:
    """A check this node cannot run; it does not count against the node."""
    return CheckResult(name, None, unit, None, Verdict.NOT_APPLICABLE, detail=reason)


def failed(name: str, unit: str, reason: str, expected: float | None = None) -> CheckResult:
    """A check whose probe broke: the device did not deliver a figure at all."""
    return CheckResult(name, None, unit, expected, Verdict.FAILED, factor=0.0, detail=reason)


def overall(results: Iterable[CheckResult]) -> Verdict:
    """The node's verdict: the worst of its checks (healthy when all are not applicable)."""
    worst = Verdict.HEALTHY
    for result in results:
        if result.verdict.severity > worst.severity:
            worst = result.verdict
    return worst


def peer_factors(rounds: Sequence[Sequence[float]]) -> list[float]:
    """Each rank's throughput over the median of its peers, median over paired rounds.

    `rounds[r][k]` is rank k's throughput in round r. Ranks run every round at the same
    time, so load from outside the check slows them alike and cancels in the ratio; this
    is what makes the comparison robust on a shared machine.
    """
    if not rounds or len(rounds[0]) < 2 or any(len(row) != len(rounds[0]) for row in rounds):
        raise ValueError("peer_factors needs rounds of equal width, at least 2 ranks")
    per_rank: list[list[float]] = [[] for _ in rounds[0]]
    for row in rounds:
        for rank, value in enumerate(row):
            peers = statistics.median([v for k, v in enumerate(row) if k != rank])
            per_rank[rank].append(value / peers if peers > 0 else 0.0)
    return [statistics.median(values) for values in per_rank]


def _round(value: float) -> float:
    return float(f"{value:.4g}")
