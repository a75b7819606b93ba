"""Thin probes that run inside one rank: time a piece of device work, nothing else.

Each probe builds its buffers once, then `timed_rounds` runs it in rounds that every rank
starts together (a barrier before each), so outside load hits all ranks alike and their
ratio stays meaningful. A throttled rank (emulation, see `throttle`) is credited with its
share of the work. Results are throughputs per round in the probe's unit; verdicts are
decided in the parent by `checks`, never here. Imports torch: load it only inside a rank.

Clocks: on an accelerator, wall time after a device synchronize. On a CPU node each rank
runs one thread and its own CPU time (`time.thread_time`) is used for the per-device
probes, so time a rank spends descheduled by other tenants of a shared machine does not
count as slowness of the device (contention for caches and memory still does). The
all-reduce is always timed by the wall clock: waiting for peers is part of it."""

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


CHUNKS = 6
"""A round runs its work in chunks of about round_s / CHUNKS and ends at the first chunk
boundary after its wall-clock window closes."""


def timed_rounds(
    probe: Probe, device: torch.device, rounds: int, round_s: float, throttle: Throttle
) -> list[float]:
    """Throughput of each round (amount per second of the rank's clock).

    Per-device probes run for the same wall-clock window on every rank (started by a
    barrier), so the ranks contend for shared caches and memory for the whole round
    alike; a throttled rank is credited with its share of the work. Collectives run a
    count of iterations all ranks agreed on.
    """
    clock = _clock(probe, device)
    per_iter = _per_iteration(probe, device, clock)
    if probe.agree_iters:
        iters = _agreed(max(1, round(round_s / per_iter)), device)
        return [_fixed_round(probe, device, iters, clock) for _ in range(rounds)]
    chunk = max(1, round(round_s / CHUNKS / per_iter))
    rate = [_window_round(probe, device, chunk, round_s, clock) for _ in range(rounds)]
    return [throttle.useful(r) if probe.throttled else r for r in rate]


def _window_round(
    probe: Probe, device: torch.device, chunk: int, round_s: float, clock: Callable[[], float]
) -> float:
    dist.barrier()
    deadline = time.perf_counter() + round_s
    start, runs = clock(), 0
    while runs == 0 or time.perf_counter() < deadline:
        probe.run(chunk)
        sync(device)
        runs += chunk
    return probe.amount * runs / max(clock() - start, 1e-9)


def _fixed_round(
    probe: Probe, device: torch.device, iters: int, clock: Callable[[], float]
) -> float:
    dist.barrier()
    start = clock()
    probe.run(iters)
    sync(device)
    return probe.amount * iters / max(clock() - start, 1e-9)


def _clock(probe: Probe, device: torch.device) -> Callable[[], float]:
    if device.type == "cpu" and not probe.agree_iters:
        return time.thread_time
    return time.perf_counter


def _per_iteration(probe: Probe, device: torch.device, clock: Callable[[], float]) -> float:
    """Seconds of one iteration, timed after one warm-up iteration."""
    probe.run(1)
    sync(device)
    start = clock()
    probe.run(2)
    sync(device)
    return max(clock() - start, 1e-6) / 2


def _agreed(iters: int, device: torch.device) -> int:
    """The smallest iteration count any rank proposed (collectives must match)."""
    count = torch.tensor([iters], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    return int(count.item())
