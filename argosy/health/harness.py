"""Run the node checks for real: one process per device, vendor signals beside them.

    report = run_check(HealthConfig(), slow={1: 0.5})   # rank 1 emulated at half speed
    report.verdict, report.exit_code

Steps: (1) find the node's devices through the backend registry and its expectations in
the catalog; (2) start one process per device (per `cpu_ranks` on a CPU node), joined in a
gloo or NCCL group; (3) read vendor signals while they probe; (4) judge the samples
(`checks`, `signals`). A rank that crashes or overruns `timeout_s` fails its checks.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import queue as queue_module
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from argosy.core.errors import ConfigError
from argosy.hardware.backends import backends
from argosy.hardware.backends.signals import SignalsUnavailableError, SupportsHealthSignals
from argosy.hardware.catalog import Catalog, default_catalog
from argosy.hardware.discovery import discover
from argosy.health.checks import probe_checks
from argosy.health.config import HealthConfig
from argosy.health.expectations import Expectations, expectations
from argosy.health.report import HealthReport, NodeInfo
from argosy.health.signals import signal_checks
from argosy.health.throttle import Throttle
from argosy.health.verdict import CheckResult
from argosy.health.worker import PHASES, ProbePlan, run_rank
from argosy.plugins.registry import Registry

DEVICE_TYPES: dict[str, tuple[str, str]] = {
    "cuda": ("cuda", "nccl"),
    "rocm": ("cuda", "nccl"),
    "xpu": ("xpu", "xccl"),
    "npu": ("npu", "hccl"),
    "cpu": ("cpu", "gloo"),
}
"""backend name -> (torch device type, torch.distributed backend)."""

AFTER_ERROR_S = 10.0
"""Seconds the other ranks get to report after one rank failed."""


@dataclass(frozen=True)
class NodePlan:
    """The node as the check sees it."""

    backend: str
    num_ranks: int
    expect: Expectations | None


def plan_node(
    config: HealthConfig,
    ranks: int | None = None,
    catalog: Catalog | None = None,
    registry: Registry | None = None,
) -> NodePlan:
    """Devices of this node (accelerators first) and their expectations."""
    devices = discover(registry)
    backend = devices[0].backend
    if backend == "cpu":
        if ranks is not None and ranks < 2:
            raise ConfigError(
                f"--ranks {ranks}: a CPU node is checked with at least 2 ranks (the collective "
                "and peer checks need two)"
            )
        num = ranks or config.cpu_ranks or max(2, min(os.cpu_count() or 1, 4))
    else:
        num = len([d for d in devices if d.backend == backend])
        if ranks is not None and ranks > num:
            raise ConfigError(f"--ranks {ranks}: this node has {num} {backend} devices")
        num = ranks or num
    chip_id = devices[0].catalog_id
    catalog = catalog or default_catalog()
    expect = expectations(catalog.get(chip_id), config) if chip_id else None
    return NodePlan(backend, num, expect)


def run_check(
    config: HealthConfig, slow: dict[int, float] | None = None, ranks: int | None = None
) -> HealthReport:
    """Probe this node and judge it; `slow` emulates throttled ranks (rank -> factor)."""
    start = time.perf_counter()
    if importlib.util.find_spec("torch") is None:
        raise ConfigError("the health check runs torch: pip install 'argosy[train]'")
    slow = slow or {}
    if ranks is not None and ranks < 1:
        raise ConfigError(f"ranks must be at least 1, got {ranks}")
    for factor in slow.values():
        Throttle(factor)  # raises on a factor outside (0, 1]
    node = plan_node(config, ranks)
    if any(not 0 <= rank < node.num_ranks for rank in slow):
        raise ConfigError(f"--emulate-slow names a rank beyond the node's {node.num_ranks}")
    rank_context()  # the fork server imports torch while the vendor signals start
    if node.backend not in DEVICE_TYPES:
        raise ConfigError(
            f"no health probes for '{node.backend}' devices; known: {sorted(DEVICE_TYPES)}"
        )
    device_type, dist_backend = DEVICE_TYPES[node.backend]
    with ThreadPoolExecutor(1) as pool, tempfile.TemporaryDirectory() as tmp:
        signals = pool.submit(read_vendor_signals, config.xid_window_s)
        plan = _probe_plan(config, node, device_type, dist_backend, f"{tmp}/store", slow)
        samples, errors = spawn_ranks(plan, config.timeout_s)
        checks = probe_checks(samples, node.expect, config, errors) + signals.result()
    info = NodeInfo(
        device_type,
        node.expect.chip_id if node.expect else None,
        node.num_ranks,
        dist_backend,
        node.expect.basis if node.expect else "chip not in catalog",
    )
    return HealthReport(
        tuple(checks), info, time.perf_counter() - start, dict(slow), phases_of(samples)
    )


def phases_of(samples: dict) -> dict[str, float]:
    """Seconds from the check's start until every rank joined its group and finished."""
    marks = [got[PHASES] for got in samples.values() if PHASES in got]
    if not marks:
        return {}
    return {"ranks_ready_s": max(m[0] for m in marks), "probes_done_s": max(m[1] for m in marks)}


def _probe_plan(
    config: HealthConfig,
    node: NodePlan,
    device_type: str,
    dist_backend: str,
    init_file: str,
    slow: dict[int, float],
) -> ProbePlan:
    on_cpu = device_type == "cpu"
    return ProbePlan(
        device_type=device_type,
        dist_backend=dist_backend,
        world_size=node.num_ranks,
        init_file=init_file,
        rounds=config.rounds,
        round_s=config.round_s,
        gemm_n=config.gemm_n if on_cpu else config.gpu_gemm_n,
        gemm_dtype="float32" if on_cpu else "bfloat16",
        memory_bytes=(config.memory_mib if on_cpu else config.gpu_memory_mib) << 20,
        bus_bytes=(config.bus_mib if on_cpu else config.gpu_bus_mib) << 20,
        host_copy_bytes=0 if on_cpu else config.gpu_host_copy_mib << 20,
        started_unix=time.time(),
        slow=slow,
    )


def rank_context() -> multiprocessing.context.BaseContext:
    """A started fork server that imported torch once; ranks are forked from it.

    Each rank then skips its own torch import (about 2 CPU-seconds per rank on a small
    machine). Starting it is idempotent.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "argosy.health.probes"])
    multiprocessing.forkserver.ensure_running()
    return ctx


def spawn_ranks(plan: ProbePlan, timeout_s: float) -> tuple[dict, dict[int, str]]:
    """Start one process per rank; samples per rank, and the ranks that failed, with why."""
    ctx = rank_context()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=run_rank, args=(r, plan, results), daemon=True)
        for r in range(plan.world_size)
    ]
    for proc in procs:
        proc.start()
    samples: dict[int, dict[str, list[float]]] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(samples) + len(errors) < plan.world_size:
        try:
            rank, got, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue_module.Empty:
            break
        if error:
            errors[rank] = error
            # the others may wait for the failed rank in a collective: give them a grace only
            deadline = min(deadline, time.monotonic() + AFTER_ERROR_S)
        else:
            samples[rank] = got
    _stop(procs)
    for rank in range(plan.world_size):
        if rank not in samples and rank not in errors:
            errors[rank] = f"no result within {timeout_s:g} s (exit code {procs[rank].exitcode})"
    return samples, errors


def _stop(procs: list) -> None:
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()


def read_vendor_signals(window_s: float, registry: Registry | None = None) -> list[CheckResult]:
    """Vendor signal checks from every detected backend that offers them."""
    registry = registry or backends
    found, reasons = [], []
    for name in registry:
        backend = registry.get(name)()
        if not (backend.detect() and isinstance(backend, SupportsHealthSignals)):
            continue
        try:
            found += backend.health_signals(window_s=window_s)
        except SignalsUnavailableError as err:
            reasons.append(f"{name}: {err}")
    reason = "; ".join(reasons) or "no backend on this node offers vendor signals"
    return signal_checks(found, reason)
