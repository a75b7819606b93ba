"""Component layer: node health checks and the node-record policy.

Probes (GEMM, memory and host-device copy bandwidth, all-reduce bus bandwidth, vendor
signals) run in real processes, one per device; pure functions turn what they measured
into verdicts (healthy, degraded with its factor, failed), and `policy` turns verdicts,
straggler reports and faults into a node state (healthy, cordoned, quarantined, repaired).
Imports `core`, `plugins` and `hardware` only; torch loads only inside the check's ranks.

    from argosy.health import HealthConfig, run_check
    report = run_check(HealthConfig())
    print(report.verdict, report.exit_code)
"""

from argosy.health.config import CpuReference, HealthConfig, NodePolicyConfig
from argosy.health.harness import run_check
from argosy.health.policy import Evidence, EvidenceKind, NodeRecord, NodeState, decide, replay
from argosy.health.report import HealthReport
from argosy.health.verdict import CheckResult, Verdict

__all__ = [
    "CheckResult",
    "CpuReference",
    "Evidence",
    "EvidenceKind",
    "HealthConfig",
    "HealthReport",
    "NodePolicyConfig",
    "NodeRecord",
    "NodeState",
    "Verdict",
    "decide",
    "replay",
    "run_check",
]
