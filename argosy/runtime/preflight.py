"""`argosy launch --preflight`: check this node's devices, then start ranks on good ones.

Runs the node check (`argosy.health.run_check`) on `need + spares` devices, lets the pure
rule (`argosy.health.preflight.choose_devices`) pick the devices, and returns what the
agent records as its `preflight` event, plus the environment that pins the ranks to the
chosen devices (`ARGOSY_DEVICES` always; the vendor's visible-devices variable on an
accelerator node). On a CPU node the devices are the check's ranks: there is nothing to
pin, and leaving one out shows only in the record.

    result = run_preflight(HealthConfig(), need=2, spares=1)
    result.event["refused"], result.env
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from argosy.core.visibility import narrowed
from argosy.health import HealthConfig, run_check
from argosy.health.preflight import choose_devices

VISIBLE_DEVICES_ENV = {
    "cuda": "CUDA_VISIBLE_DEVICES",  # ROCm honours it too
    "xpu": "ZE_AFFINITY_MASK",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
}
"""torch device type -> the variable that limits which devices a process sees."""


@dataclass(frozen=True)
class PreflightResult:
    """The `preflight` event's fields and the ranks' extra environment."""

    event: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def refused(self) -> str | None:
        return self.event["refused"]

    @property
    def excluded(self) -> int:
        return len(self.event["excluded"])


def run_preflight(
    config: HealthConfig, need: int, spares: int, slow: dict[int, float] | None = None
) -> PreflightResult:
    """Check `need + spares` devices and choose `need` of them (or refuse)."""
    report = run_check(config, slow=slow, ranks=need + spares)
    decision = choose_devices(report, need)
    event = {
        "verdict": report.verdict.value,
        "elapsed_s": round(report.elapsed_s, 2),
        "device_type": report.node.device_type,
        "checked": report.node.num_ranks,
        **decision.to_json(),
        "checks": [
            {"name": c.name, "verdict": c.verdict.value, "factor": c.factor} for c in report.checks
        ],
        "emulated_slow": {str(r): f for r, f in sorted((slow or {}).items())},
    }
    env: dict[str, str] = {}
    if decision.refused is None:
        devices = ",".join(str(d) for d in decision.use)
        env["ARGOSY_DEVICES"] = devices
        variable = VISIBLE_DEVICES_ENV.get(report.node.device_type)
        if variable is not None:  # what this process sees may be narrowed already
            env[variable] = narrowed(variable, decision.use, os.environ)
    return PreflightResult(event, env)
