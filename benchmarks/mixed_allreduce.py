"""Hierarchical all-reduce bandwidth against the slowest link's floor (gloo, CPU ranks).

Imported by benchmarks/mixed.py; runs on its own too:

    .venv/bin/python benchmarks/mixed_allreduce.py --mib 16 --groups 0,1,1

In one spawn of gloo processes (one per entry of --groups), for a float32 tensor of
--mib MiB, median of --repeats timed calls after one warm-up each:
- link floor: one-way send/recv bandwidth between the two group leaders (the cross-group
  link; on this host every link is loopback TCP, so it is also the slowest);
- flat: torch.distributed.all_reduce over every rank (gloo's own algorithm);
- hierarchical: argosy.runtime.mixed.allreduce (reduce in group, leaders exchange,
  broadcast back; chunked into a pipeline).
Bus bandwidth = bytes x 2 (n - 1) / n / time (the nccl-tests convention).
"""

from __future__ import annotations

import argparse
import json
import queue
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _timed(fn, repeats: int) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(
    rank: int, world: int, port: int, groups: list[int], mib: float, repeats: int, out
) -> None:  # noqa: ANN001, E501
    from argosy.runtime.mixed.allreduce import HierarchicalAllReduce

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    tensor = torch.ones(int(mib * 2**20 / 4))
    leaders = [groups.index(g) for g in sorted(set(groups))]
    a, b = leaders[0], leaders[1] if len(leaders) > 1 else (1 if world > 1 else 0)

    def link() -> None:
        if rank == a:
            dist.send(tensor, dst=b)
        elif rank == b:
            dist.recv(tensor, src=a)

    ar = HierarchicalAllReduce(groups, "cpu")
    results = {
        "link_s": _timed(link, repeats),
        "flat_s": _timed(lambda: dist.all_reduce(tensor), repeats),
        "hierarchical_s": _timed(lambda: ar.all_reduce(tensor).wait(), repeats),
    }
    ar.close()
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def measure(groups: list[int], mib: float = 16.0, repeats: int = 5) -> dict:
    """Times and bandwidths (GB/s) of the link floor, flat and hierarchical all-reduce."""
    world = len(groups)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _port()
    args = (world, port, groups, mib, repeats, out)
    procs = [ctx.Process(target=_rank, args=(r, *args)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        result = out.get(timeout=600)
    except queue.Empty as err:
        raise RuntimeError("all-reduce benchmark ranks gave no result") from err
    finally:
        for p in procs:
            p.join(timeout=60)
    size = mib * 2**20
    bus = 2 * (world - 1) / world
    result["link_gbps"] = size / result["link_s"] / 1e9
    result["flat_busbw_gbps"] = size * bus / result["flat_s"] / 1e9
    result["hierarchical_busbw_gbps"] = size * bus / result["hierarchical_s"] / 1e9
    result["hierarchical_vs_link"] = result["hierarchical_busbw_gbps"] / result["link_gbps"]
    result["hierarchical_vs_flat"] = result["flat_s"] / result["hierarchical_s"]
    return {"groups": groups, "mib": mib, "repeats": repeats, **result}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=16.0)
    p.add_argument("--groups", default="0,1,1", help="chip group of each rank")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    groups = [int(g) for g in args.groups.split(",")]
    print(json.dumps(measure(groups, args.mib, args.repeats), indent=1))


if __name__ == "__main__":
    main()
