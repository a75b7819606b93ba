"""Hierarchical all-reduce bandwidth against the slowest link's floor (gloo, CPU ranks).

Imported by benchmarks/mixed.py; runs on its own too:

    .venv/bin/python benchmarks/mixed_allreduce.py --mib 16 --groups 0,1,1

In one spawn of gloo processes (one per entry of --groups), for a float32 tensor of
--mib MiB, --rounds rounds, each timing the three below in turn (median of --repeats
calls after one warm-up each), so that the floor and the all-reduce see the same load;
the figure is the median over rounds of the per-round ratio:
- link floor: one-way send/recv bandwidth between the two group leaders (the cross-group
  link; on this host every link is loopback TCP, so it is also the slowest; with
  --cross-link-gbs, that link is emulated at the given rate, floor and all-reduce alike,
  and the links inside a group stay loopback, as on a cluster whose vendor groups meet
  over a slower network than their own);
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


def _rank(  # noqa: PLR0913
    rank: int,
    world: int,
    port: int,
    groups: list[int],
    mib: float,
    repeats: int,
    rounds: int,
    cross_link: float | None,
    out,  # noqa: ANN001
) -> None:
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
        start = time.perf_counter()
        if rank == a:
            dist.send(tensor, dst=b)
        elif rank == b:
            dist.recv(tensor, src=a)
        if cross_link and rank in (a, b):  # the emulated link: at least bytes / rate
            time.sleep(max(0.0, start + tensor.nbytes / cross_link - time.perf_counter()))

    ar = HierarchicalAllReduce(groups, "cpu", cross_link_bytes_per_s=cross_link)
    results: dict[str, list[float]] = {"link_s": [], "flat_s": [], "hierarchical_s": []}
    for _ in range(rounds):
        results["link_s"].append(_timed(link, repeats))
        results["flat_s"].append(_timed(lambda: dist.all_reduce(tensor), repeats))
        results["hierarchical_s"].append(_timed(lambda: ar.all_reduce(tensor).wait(), repeats))
    ar.close()
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def measure(
    groups: list[int],
    mib: float = 16.0,
    repeats: int = 5,
    rounds: int = 5,
    cross_link_gbs: float | None = None,
) -> dict:
    """Times and bandwidths (GB/s) of the link floor, flat and hierarchical all-reduce:
    medians over rounds, and the median of the per-round ratios. `cross_link_gbs`: the
    link between the group leaders emulated at that rate (GB/s), floor and all-reduce
    alike (EMULATION: loopback is as fast inside a group as across)."""
    cross_link = cross_link_gbs * 1e9 if cross_link_gbs else None
    world = len(groups)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _port()
    args = (world, port, groups, mib, repeats, rounds, cross_link, out)
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
    per_round = [
        (size * bus / h) / (size / link)
        for link, h in zip(result["link_s"], result["hierarchical_s"], strict=True)
    ]
    times = {key: statistics.median(values) for key, values in result.items()}
    return {
        "groups": groups,
        "mib": mib,
        "repeats": repeats,
        "rounds": rounds,
        "cross_link_gbs": cross_link_gbs,
        **times,
        "link_gbps": size / times["link_s"] / 1e9,
        "flat_busbw_gbps": size * bus / times["flat_s"] / 1e9,
        "hierarchical_busbw_gbps": size * bus / times["hierarchical_s"] / 1e9,
        "hierarchical_vs_link": statistics.median(per_round),
        "hierarchical_vs_link_rounds": per_round,
        "hierarchical_vs_flat": statistics.median(
            f / h for f, h in zip(result["flat_s"], result["hierarchical_s"], strict=True)
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=16.0)
    p.add_argument("--groups", default="0,1,1", help="chip group of each rank")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cross-link-gbs", type=float, default=None, help="emulated link, GB/s")
    args = p.parse_args()
    groups = [int(g) for g in args.groups.split(",")]
    result = measure(groups, args.mib, args.repeats, args.rounds, args.cross_link_gbs)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
