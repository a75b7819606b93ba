"""Thin probes that run inside one rank: time a piece of device work, nothing else.

Each probe builds its buffers once, then `timed_rounds` runs it in rounds that every rank
starts together (a barrier before each), so outside load hits all ranks alike and their
ratio stays meaningful. A throttled rank (emulation, see `throttle`) idles after each
round. Results are throughputs per round in the probe's unit; verdicts are decided in the
parent by `checks`, never here. Imports torch: load this module only inside a rank.

Clocks: on an accelerator, wall time after a device synchronize. On a CPU node each rank
runs one thread and its own CPU time (`time.thread_time`) is used for the per-device
probes, so time a rank spends descheduled by other tenants of a shared machine does not
count as slowness of the device (contention for caches and memory still does). The
all-reduce is always timed by the wall clock: waiting for peers is part of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from argosy.health.throttle import Throttle


@dataclass(frozen=True)
class Probe:
    """One probe: `run(iters)` does the work `iters` times; `amount` is work per iteration."""

    run: Callable[[int], None]
    amount: float
    throttled: bool = True
    agree_iters: bool = False
    """All ranks must run the same iteration count (collectives)."""


def sync(device: torch.device) -> None:
    """Wait for queued device work (nothing to wait for on a CPU)."""
    if device.type != "cpu":
        torch.accelerator.synchronize()


def gemm_probe(device: torch.device, n: int, dtype: torch.dtype) -> Probe:
    """Square matmuls; amount in TFLOP."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty_like(a)

    def run(iters: int) -> None:
        for _ in range(iters):
            torch.matmul(a, b, out=out)

    return Probe(run, 2 * n**3 / 1e12)


def memory_probe(device: torch.device, num_bytes: int) -> Probe:
    """Buffer copies on the device; amount in GB read plus written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)

    def run(iters: int) -> None:
        for _ in range(iters):
            dst.copy_(src)

    return Probe(run, 2 * num_bytes / 1e9)


def host_copy_probe(device: torch.device, num_bytes: int) -> Probe:
    """Pinned host to device and back; amount in GB moved over the host link."""
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True).fill_(1)
    dev = torch.empty(num_bytes, dtype=torch.uint8, device=device)

    def run(iters: int) -> None:
        for _ in range(iters):
            dev.copy_(host, non_blocking=True)
            host.copy_(dev, non_blocking=True)

    return Probe(run, 2 * num_bytes / 1e9)


def bus_probe(device: torch.device, num_bytes: int, world_size: int) -> Probe:
    """All-reduce across the node's ranks; amount in GB of bus traffic (nccl-tests busbw)."""
    data = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)

    def run(iters: int) -> None:
        for _ in range(iters):
            dist.all_reduce(data)

    return Probe(run, num_bytes * 2 * (world_size - 1) / world_size / 1e9, False, True)


MIN_ITERS = 8
"""Fewest iterations per round, so a throttle's rounding stays within a few percent."""


def timed_rounds(
    probe: Probe, device: torch.device, rounds: int, round_s: float, throttle: Throttle
) -> list[float]:
    """Throughput of each round (amount per second), rounds started together on all ranks."""
    clock = _clock(probe, device)
    iters = _iterations(probe, device, round_s, clock)
    runs = throttle.iterations(iters) if probe.throttled else iters
    samples = []
    for _ in range(rounds):
        dist.barrier()
        start = clock()
        probe.run(runs)
        sync(device)
        samples.append(probe.amount * iters / max(clock() - start, 1e-9))
    return samples


def _clock(probe: Probe, device: torch.device) -> Callable[[], float]:
    if device.type == "cpu" and not probe.agree_iters:
        return time.thread_time
    return time.perf_counter


def _iterations(
    probe: Probe, device: torch.device, round_s: float, clock: Callable[[], float]
) -> int:
    """Iterations that fill about `round_s`, timed after one warm-up iteration."""
    probe.run(1)
    sync(device)
    start = clock()
    probe.run(2)
    sync(device)
    per_iter = max(clock() - start, 1e-6) / 2
    iters = max(MIN_ITERS if probe.throttled else 1, round(round_s / per_iter))
    if probe.agree_iters:
        count = torch.tensor([iters], dtype=torch.int64, device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MIN)
        iters = int(count.item())
    return iters
