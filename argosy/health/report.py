"""The result of a node check: the verdict, every check, and how it was obtained.

`to_json()` is the contract of `argosy health check --json`:
`{"verdict", "checks": [{"name", "value", "unit", "expected", "verdict", ...}], ...}`,
with extra keys `factor` and `detail` per check, and `slow_devices`, `elapsed_s`, `node`
`phases` and `emulated_slow` at the top.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from argosy.health.verdict import CheckResult, Verdict, overall

_PEER = re.compile(r"^(?P<probe>\w+)_peer\.rank(?P<rank>\d+)$")


@dataclass(frozen=True)
class NodeInfo:
    """What was checked: the device type, the catalog chip, ranks, expectation basis."""

    device_type: str
    chip_id: str | None
    num_ranks: int
    dist_backend: str
    basis: str


@dataclass(frozen=True)
class HealthReport:
    """Checks of one node and the node's verdict (the worst check)."""

    checks: tuple[CheckResult, ...]
    node: NodeInfo
    elapsed_s: float
    emulated_slow: dict[int, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds from the start until the ranks were ready and until their probes were done."""

    @property
    def verdict(self) -> Verdict:
        return overall(self.checks)

    @property
    def exit_code(self) -> int:
        """0 when healthy, 1 when degraded or failed."""
        return 0 if self.verdict is Verdict.HEALTHY else 1

    def slow_devices(self) -> list[dict[str, Any]]:
        """Ranks whose peer checks are not healthy, with their worst factor."""
        worst: dict[int, CheckResult] = {}
        for check in self.checks:
            match = _PEER.match(check.name)
            if not match or check.verdict in (Verdict.HEALTHY, Verdict.NOT_APPLICABLE):
                continue
            rank = int(match["rank"])
            if rank not in worst or (check.factor or 0) < (worst[rank].factor or 0):
                worst[rank] = check
        return [
            {"rank": r, "factor": c.factor, "verdict": c.verdict.value, "check": c.name}
            for r, c in sorted(worst.items())
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "checks": [check.to_json() for check in self.checks],
            "slow_devices": self.slow_devices(),
            "elapsed_s": round(self.elapsed_s, 2),
            "phases": {k: round(v, 2) for k, v in self.phases.items()},
            "node": vars(self.node),
            "emulated_slow": {str(r): f for r, f in sorted(self.emulated_slow.items())},
        }
