"""Load the inputs of `argosy sim run` and run one or several policies on them.

    results = run_policies("h100:10000", "q.yaml", "trace.jsonl", ["fifo", "argosy"])

Every policy sees the same cluster, queues, trace and seed (so the same faults)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from argosy.hardware.loader import load_cluster
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import load_queues
from argosy.sim.config import SimConfig
from argosy.sim.engine import Simulation
from argosy.sim.isolation import NodeIsolation
from argosy.sim.trace import read_trace


def run_policies(
    cluster_spec: str,
    queues_path: str | Path,
    trace_path: str | Path,
    names: list[str],
    *,
    seed: int = 0,
    on_error: str = "stop",
    scheduler: SchedulerConfig | None = None,
    sim: SimConfig | None = None,
    progress: Callable[[str, float], None] | None = None,
    isolation: Callable[[], NodeIsolation] | None = None,
) -> tuple[list[dict], int, list[str]]:
    """Reports (with `_samples` for plots), the device count, and skipped trace lines.
    `isolation` makes a fresh node isolation for each policy that quarantines."""
    cluster = load_cluster(cluster_spec)
    chosen = [policies.get(name) for name in names]  # unknown names fail before any work
    load_queues(queues_path, cluster)  # validate once, before reading a large trace
    trace = read_trace(trace_path, on_error=on_error)  # type: ignore[arg-type]
    reports = []
    for policy in chosen:
        tree = load_queues(queues_path, cluster)
        tick = (lambda f, p=policy.name: progress(p, f)) if progress else None
        simulation = Simulation(cluster, tree, trace.records, policy, seed=seed,
                                config=scheduler, sim=sim, progress=tick,
                                isolation=isolation() if isolation else None)  # fmt: skip
        report = simulation.run()
        report["_samples_t"] = simulation.acc.samples_t
        report["_samples"] = [s.tolist() for s in simulation.acc.samples]
        report["rejected_reasons"] = simulation.acc.rejected[:20]
        report["skipped_trace_lines"] = len(trace.skipped)
        reports.append(report)
    return reports, cluster.num_devices, trace.skipped
