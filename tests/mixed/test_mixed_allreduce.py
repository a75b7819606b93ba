"""Hierarchical all-reduce and sample-weighted gradients, in real gloo processes."""

from __future__ import annotations

import queue
import socket
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
import mixed_workers  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(target, world: int, *args) -> list:  # noqa: ANN001
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = []
    try:
        while any(p.is_alive() for p in procs) or not out.empty():
            try:
                results.append(out.get(timeout=1.0))
            except queue.Empty:
                continue
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return results


WEIGHTED = {"samples": [21, 8, 7, 4], "groups": [0, 1, 1, 2], "micro_batch": 3}


@pytest.mark.integration
def test_hierarchical_sum_and_weighted_gradients_in_gloo_processes() -> None:
    """One spawn of 4 ranks: the hierarchical sum equals the flat all-reduce over random
    group shapes, over TCP and over shared memory (leaders only, and every rank of the
    CPU groups), then a step with uneven samples per rank (21/8/7/4 over 3 chip groups)
    gives the full-batch gradient, through the DDP hook (TCP) and through GradSync (shared
    memory)."""
    shapes = mixed_workers.random_shapes(seed=4, world=4, count=6)
    results = _run(mixed_workers.both, 4, shapes, WEIGHTED)
    sums = [r for r in results if r[0] == "sum"]
    grads = [r for r in results if r[0] == "grad"]
    transports = mixed_workers.TRANSPORTS
    assert len(sums) == 4 * len(shapes) * len(transports) and len(grads) == 2 * 4
    for _, rank, index, transport, exact, diff in sums:
        where = f"rank {rank}, shape {shapes[index]}, {transport}"
        assert exact, f"{where}: integer sums differ"
        assert diff < 1e-4, f"{where}: max diff {diff}"
    assert {path for _, _, path, _ in grads} == {"ddp", "gradsync"}
    for _, rank, path, diff in grads:
        assert diff < 1e-6, f"rank {rank} via {path}: gradient off by {diff}"
