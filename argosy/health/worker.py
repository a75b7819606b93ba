"""The body of one check rank: join the node's process group, run the probes, report.

Started by `harness` in a fresh (spawned) process per device. It sends one message to the
parent: `(rank, {probe: [throughput per round]}, error)`, where `error` is None or the
reason the rank could not finish. Imports torch only when a rank starts.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.queues import Queue

PHASES = "_phases"
"""Sample key of [seconds to group joined, seconds to probes done] since the check started."""


@dataclass(frozen=True)
class ProbePlan:
    """Everything a rank needs to run its probes (picklable)."""

    device_type: str
    """torch device type: cpu, cuda, xpu, npu."""
    dist_backend: str
    """torch.distributed backend: gloo, nccl, xccl, hccl."""
    world_size: int
    init_file: str
    rounds: int
    round_s: float
    gemm_n: int
    gemm_dtype: str
    memory_bytes: int
    bus_bytes: int
    host_copy_bytes: int = 0
    """Host-device copy size (accelerators only)."""
    started_unix: float = 0.0
    """When the check started (time.time()); phases are reported relative to it."""
    slow: dict[int, float] = field(default_factory=dict)
    """Emulated slow ranks: rank -> throttle factor."""


def run_rank(rank: int, plan: ProbePlan, queue: Queue) -> None:
    """Process entry point: probe, then put the samples (or the error) on `queue`."""
    try:
        queue.put((rank, _probe_all(rank, plan), None))
    except Exception as err:  # any failure of the device is reported to the parent
        detail = traceback.format_exception_only(type(err), err)[-1].strip()
        queue.put((rank, {}, detail))


def _probe_all(rank: int, plan: ProbePlan) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    from argosy.health import probes
    from argosy.health.throttle import Throttle

    device = _device(torch, plan.device_type, rank)
    dist.init_process_group(
        plan.dist_backend,
        init_method=f"file://{plan.init_file}",
        rank=rank,
        world_size=plan.world_size,
    )
    try:
        throttle = Throttle(plan.slow.get(rank, 1.0))
        suite = {
            "gemm": probes.gemm_probe(device, plan.gemm_n, getattr(torch, plan.gemm_dtype)),
            "memory": probes.memory_probe(device, plan.memory_bytes),
        }
        if device.type != "cpu":
            suite["host_copy"] = probes.host_copy_probe(device, plan.host_copy_bytes)
        if plan.world_size > 1:
            suite["bus"] = probes.bus_probe(device, plan.bus_bytes, plan.world_size)
        ready_s = time.time() - plan.started_unix
        found = {
            name: probes.timed_rounds(probe, device, plan.rounds, plan.round_s, throttle)
            for name, probe in suite.items()
        }
        found[PHASES] = [ready_s, time.time() - plan.started_unix]
        return found
    finally:
        dist.destroy_process_group()


def _device(torch, device_type: str, rank: int):  # noqa: ANN001  # torch module, loaded late
    if device_type == "cpu":
        torch.set_num_threads(1)
        return torch.device("cpu")
    torch.accelerator.set_device_index(rank)
    return torch.device(device_type, rank)
