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


@pytest.mark.integration
@pytest.mark.parametrize("world", [3, 4])
def test_hierarchical_sum_equals_flat_all_reduce_over_random_group_shapes(world: int) -> None:
    shapes = mixed_workers.random_shapes(seed=world, world=world, count=6)
    results = _run(mixed_workers.hierarchical_vs_flat, world, shapes)
    assert len(results) == world * len(shapes)
    for rank, index, exact, diff in results:
        assert exact, f"rank {rank}, shape {shapes[index]}: integer sums differ"
        assert diff < 1e-4, f"rank {rank}, shape {shapes[index]}: max diff {diff}"


CASES = {
    "2:1 split, two groups": {"samples": [10, 5], "groups": [0, 1], "micro_batch": 2},
    "3 ranks 21/8/7, group of two": {"samples": [21, 8, 7], "groups": [0, 1, 1], "micro_batch": 3},
}


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_weighted_gradient_equals_the_full_batch_gradient(case: dict) -> None:
    world = len(case["samples"])
    results = _run(mixed_workers.weighted_grads, world, case)
    assert {path for _, path, _ in results} == {"ddp", "gradsync"}
    assert len(results) == 2 * world
    for rank, path, diff in results:
        assert diff < 1e-6, f"rank {rank} via {path}: gradient off by {diff}"
