"""Rank bodies for the mixed-chip tests: real gloo processes (spawned), results by queue."""

from __future__ import annotations

import random
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from argosy.runtime.mixed.allreduce import HierarchicalAllReduce, HookState, hierarchical_hook
from argosy.runtime.mixed.gradsync import GradSync
from argosy.runtime.mixed.weighting import micro_batch_scales, micro_batch_sizes, rank_weights


def init_gloo(rank: int, world: int, port: int, timeout_s: float = 60) -> None:
    """Join a one-thread gloo world on 127.0.0.1:`port`."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def both(rank: int, world: int, port: int, shapes: list, case: dict, out) -> None:  # noqa: ANN001
    """`hierarchical_vs_flat`, then `weighted_grads`, in one process group."""
    init_gloo(rank, world, port)
    hierarchical_vs_flat(rank, shapes, out)
    weighted_grads(rank, case, out)
    dist.destroy_process_group()


def hierarchical_vs_flat(rank: int, shapes: list, out) -> None:  # noqa: ANN001
    """For each group shape and transport (tcp, shm between leaders, shm joined by the
    CPU groups' ranks): integer tensors must sum exactly as a flat all-reduce does,
    random ones to float tolerance. Puts ("sum", rank, shape index, transport, exact,
    max abs diff)."""
    for index, shape in enumerate(shapes):
        for transport in TRANSPORTS:
            _compare(rank, index, shape, transport, out)


TRANSPORTS = ("tcp", "shm-leaders", "shm-joined")


def _compare(rank: int, index: int, shape: tuple, transport: str, out) -> None:  # noqa: ANN001
    group_of_rank, numel, chunk_bytes, link = shape
    ar = HierarchicalAllReduce(
        group_of_rank,
        "cpu",
        chunk_bytes=chunk_bytes,
        cross_link_bytes_per_s=link,
        transport=transport.split("-")[0],
        host_groups_join=transport == "shm-joined",
    )
    g = torch.Generator().manual_seed(1000 * index + rank)
    ints = torch.randint(-1000, 1000, (numel,), generator=g).float()
    reals = torch.randn(numel, generator=g)
    want_ints, want_reals = ints.clone(), reals.clone()
    dist.all_reduce(want_ints)
    dist.all_reduce(want_reals)
    futures = [ar.all_reduce(ints), ar.all_reduce(reals)]  # two in flight at once
    for f in futures:
        f.wait()
    diff = float((reals - want_reals).abs().max()) if numel else 0.0
    out.put(("sum", rank, index, transport, bool(torch.equal(ints, want_ints)), diff))
    ar.close()


def _model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)
    )


def _data(global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(global_batch, 6, generator=g), torch.randn(global_batch, 1, generator=g)


def _reference_grads(global_batch: int) -> list[torch.Tensor]:
    model = _model()
    x, y = _data(global_batch)
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def weighted_grads(rank: int, case: dict, out) -> None:  # noqa: ANN001
    """One step with uneven samples per rank, through the DDP hook and through GradSync;
    puts ("grad", rank, path, max abs diff to the single-process full-batch gradient)."""
    samples, groups, mbs = case["samples"], case["groups"], case["micro_batch"]
    total = sum(samples)
    offset = sum(samples[:rank])
    x, y = _data(total)
    x, y = x[offset : offset + samples[rank]], y[offset : offset + samples[rank]]
    want = _reference_grads(total)
    weight = rank_weights(samples)[rank]
    ar = HierarchicalAllReduce(groups, "cpu", chunk_bytes=256)

    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.0005)
    ddp.register_comm_hook(HookState(ar, weight), hierarchical_hook)
    # DDP may issue collectives in forward: one forward per rank, uneven sizes
    _accumulate(ddp, x, y, len(x), sync=None)
    out.put(("grad", rank, "ddp", _max_diff(ddp.module, want)))

    ar.close()
    ar = HierarchicalAllReduce(groups, "cpu", chunk_bytes=256, transport="shm")
    model = _model()
    sync = GradSync(model, ar, weight=weight, bucket_bytes=512)
    _accumulate(model, x, y, mbs, sync=sync)
    sync.wait()
    out.put(("grad", rank, "gradsync", _max_diff(model, want)))
    ar.close()


def _accumulate(model: nn.Module, x, y, mbs: int, sync: GradSync | None) -> None:  # noqa: ANN001
    sizes = micro_batch_sizes(len(x), mbs)
    scales = micro_batch_scales(len(x), mbs)
    begin = 0
    for i, (size, scale) in enumerate(zip(sizes, scales, strict=True)):
        last = i == len(sizes) - 1
        xs, ys = x[begin : begin + size], y[begin : begin + size]
        begin += size
        loss = nn.functional.mse_loss(model(xs), ys) * scale
        if sync is not None:
            with sync.armed(last):
                loss.backward()
        elif last:
            loss.backward()
        else:
            with model.no_sync():
                loss.backward()


def _max_diff(model: nn.Module, want: list[torch.Tensor]) -> float:
    return max(
        float((p.grad - w).abs().max()) for p, w in zip(model.parameters(), want, strict=True)
    )


def random_shapes(
    seed: int, world: int, count: int
) -> list[tuple[list[int], int, int, float | None]]:
    """Random group shapes over `world` ranks (groups not contiguous, leaders anywhere)."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        num_groups = rng.randint(1, world)
        group_of_rank = [rng.randrange(num_groups) for _ in range(world)]
        numel = rng.choice([0, 1, 7, 300, 1025, 5000])
        link = rng.choice([None, 2e9])  # an emulated cross-group link changes timing only
        shapes.append((group_of_rank, numel, rng.choice([64, 1024, 4 * 2**20]), link))
    return shapes
