"""Rank bodies for the shared-memory transport tests (spawned gloo processes)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from mixed_workers import init_gloo

from argosy.runtime.mixed.shm import PREFIX, SHM_DIR, ShmGroup, ShmPeerError


def _segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{PREFIX}*")}


def suite(rank: int, world: int, port: int, out) -> None:  # noqa: ANN001
    """`sums_and_copies`, then `absent_peer`, then `dead_peer`, in one spawn of 3 ranks."""
    init_gloo(rank, world, port, timeout_s=30)
    sums_and_copies(rank, world, out)
    absent_peer(rank, world, out)
    dead_peer(rank, world, out)


def sums_and_copies(rank: int, world: int, out) -> None:  # noqa: ANN001
    """ShmGroup's all-reduce against gloo's on several dtypes, sizes and chunk sizes
    (integers exactly), a one-way copy, and no segment file left once mapped. Puts
    ("sum", rank, case, exact), ("copy", rank, exact), ("files", rank, names)."""
    cases = [(torch.float32, 0), (torch.float32, 1), (torch.float32, 1001)]
    cases += [(torch.int64, 4099), (torch.float64, 777), (torch.bfloat16, 300)]
    for chunk_bytes in (1000, 2**20):  # 1000: many chunks, a slot rounded up to 1024
        group = ShmGroup(list(range(world)), chunk_bytes=chunk_bytes)
        out.put(("files", rank, sorted(_segments())))
        for index, (dtype, numel) in enumerate(cases):
            g = torch.Generator().manual_seed(100 * index + rank)
            t = torch.randint(-100, 100, (numel,), generator=g).to(dtype)
            want = t.clone()
            dist.all_reduce(want)
            group.all_reduce(t)
            out.put(("sum", rank, (chunk_bytes, str(dtype), numel), bool(torch.equal(t, want))))
        group.close()
    pair = ShmGroup([0, 2], chunk_bytes=4096)  # every rank creates it, as with new_group
    data = torch.arange(10_000, dtype=torch.float32) * (rank + 1)
    if rank == 0:
        pair.send(data, 2)
    elif rank == 2:
        pair.recv(data, 0)
        out.put(("copy", rank, bool(torch.equal(data, torch.arange(10_000.0)))))
    pair.close()


def _try(group: ShmGroup, t: torch.Tensor) -> tuple[float, str]:
    start = time.monotonic()
    try:
        group.all_reduce(t)
        message = ""
    except ShmPeerError as err:
        message = str(err)
    return time.monotonic() - start, message


def absent_peer(rank: int, world: int, out) -> None:  # noqa: ANN001
    """Rank 2 is alive but never calls: ranks 0 and 1 must time out (1 s). Puts
    ("idle", rank, seconds to the error, message)."""
    group = ShmGroup(list(range(world)), chunk_bytes=4096, timeout_s=1.0)
    if rank != 2:
        out.put(("idle", rank, *_try(group, torch.ones(10_000))))
    dist.barrier()
    group.close()


def dead_peer(rank: int, world: int, out) -> None:  # noqa: ANN001
    """Rank 2 exits once the segment is mapped and used; ranks 0 and 1 must get a
    ShmPeerError naming it. Puts ("exit", rank, seconds to the error, message)."""
    group = ShmGroup(list(range(world)), chunk_bytes=4096, timeout_s=20.0)
    t = torch.ones(10_000)
    group.all_reduce(t)  # one round with everyone
    dist.barrier()
    if rank != 2:
        out.put(("exit", rank, *_try(group, t)))
    out.close()
    out.join_thread()  # flushed before the exit below
    os._exit(0)  # the gloo group has lost a member: skip its teardown
