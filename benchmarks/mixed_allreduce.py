"""Hierarchical all-reduce bandwidth against the slowest link's floor (CPU ranks), over
TCP and over shared host memory.

Imported by benchmarks/mixed.py; runs on its own too:

    .venv/bin/python benchmarks/mixed_allreduce.py --mib 16 --groups 0,1,1

In one spawn of gloo processes (one per entry of --groups), for a float32 tensor of
--mib MiB, --rounds rounds, each timing the calls below in turn (median of --repeats
calls after one warm-up each), so that the floors and the all-reduces see the same load;
each ratio is the median over rounds of the per-round ratio:
- floors, one-way copies of the tensor between the two first group leaders (the
  cross-group link), one per transport: `link` over gloo send/recv (loopback TCP) and
  `shm_link` through argosy.runtime.mixed.shm (a shared segment, chunked and pipelined:
  per round the fastest of 1, 2 and 4 MiB chunks; the all-reduce uses 4 MiB). With
  --cross-link-gbs, that link is emulated at the given rate, floors and exchanges alike,
  and the links inside a group stay as they are, as on a cluster whose vendor groups meet
  over a slower network than their own;
- flat: torch.distributed.all_reduce over every rank (gloo's own algorithm, TCP);
- hierarchical (argosy.runtime.mixed.allreduce, chunked into a pipeline), three ways:
  `hierarchical` (transport tcp: gloo reduce in group, gloo between leaders, broadcast),
  `shm_leaders` (transport shm, host_groups_join off: in-group phases over gloo, leaders
  exchange through shared memory) and `shm_joined` (transport shm: the CPU groups' ranks
  all join one shared-memory reduce-scatter / all-gather, no in-group phase).
Each all-reduce is compared with the floor of the transport it uses: tcp and flat with
`link`, shm_joined with `shm_link`, shm_leaders with both where a group has two ranks
or more (its in-group links are TCP, its cross link shared memory: the slower of the
two is its floor), else with `shm_link`.
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


SHM_FLOOR_CHUNKS = (1 * 2**20, 2 * 2**20, 4 * 2**20)  # the shm floor: the fastest of these


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
    from argosy.runtime.mixed.shm import ShmGroup

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
    pairs = [ShmGroup(sorted({a, b}), chunk_bytes=c) for c in SHM_FLOOR_CHUNKS] if a != b else []

    def one_way(send, recv):  # noqa: ANN001, ANN202
        def link() -> None:
            start = time.perf_counter()
            if rank == a:
                send(tensor, b)
            elif rank == b:
                recv(tensor, a)
            if cross_link and rank in (a, b):  # the emulated link: at least bytes / rate
                time.sleep(max(0.0, start + tensor.nbytes / cross_link - time.perf_counter()))

        return link

    calls = {
        "link_s": one_way(dist.send, dist.recv),
        **{
            f"shm_link_{c >> 20}mib_s": one_way(p.send, p.recv)
            for c, p in zip(SHM_FLOOR_CHUNKS, pairs, strict=False)
        },
        "flat_s": lambda: dist.all_reduce(tensor),
    }
    ars = {
        "hierarchical_s": HierarchicalAllReduce(groups, "cpu", cross_link_bytes_per_s=cross_link),
        "shm_leaders_s": HierarchicalAllReduce(
            groups,
            "cpu",
            cross_link_bytes_per_s=cross_link,
            transport="shm",
            host_groups_join=False,
        ),
        "shm_joined_s": HierarchicalAllReduce(
            groups, "cpu", cross_link_bytes_per_s=cross_link, transport="shm"
        ),
    }
    for key, ar in ars.items():
        calls[key] = lambda ar=ar: ar.all_reduce(tensor).wait()
    results: dict[str, list[float]] = {key: [] for key in calls}
    for _ in range(rounds):
        for key, fn in calls.items():
            results[key].append(_timed(fn, repeats))
    for ar in ars.values():
        ar.close()
    for pair in pairs:
        pair.close()
    for round_ in range(rounds):  # the transport's floor: its fastest chunk size
        sizes = [results[f"shm_link_{c >> 20}mib_s"][round_] for c in SHM_FLOOR_CHUNKS if pairs]
        results.setdefault("shm_link_s", []).append(min(sizes) if sizes else float("nan"))
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
    """Times and bandwidths (GB/s) of the link floors (TCP, shared memory), the flat and
    the three hierarchical all-reduces (module docstring): medians over rounds, and the
    median of the per-round ratios to each one's floor (`<name>_vs_link`) and to the flat
    all-reduce (`<name>_vs_flat`). `cross_link_gbs`: the link between the group leaders
    emulated at that rate (GB/s), floors and exchanges alike (EMULATION: loopback is as
    fast inside a group as across)."""
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
    floors = {
        "hierarchical": ["link_s"],
        "flat": ["link_s"],
        # its in-group phases run over TCP where a group has two ranks or more
        "shm_leaders": ["shm_link_s"] + (["link_s"] if len(set(groups)) < world else []),
        "shm_joined": ["shm_link_s"],
    }
    times = {key: statistics.median(values) for key, values in result.items()}
    out = {
        "groups": groups,
        "mib": mib,
        "repeats": repeats,
        "rounds": rounds,
        "cross_link_gbs": cross_link_gbs,
        **times,
        "link_gbps": size / times["link_s"] / 1e9,
        "shm_link_gbps": size / times["shm_link_s"] / 1e9,
    }
    for name, keys in floors.items():
        per_round = [
            (size * bus / r[f"{name}_s"]) / (size / max(r[k] for k in keys))
            for r in _rounds(result)
        ]
        out[f"{name}_busbw_gbps"] = size * bus / times[f"{name}_s"] / 1e9
        out[f"{name}_vs_link"] = statistics.median(per_round)
        out[f"{name}_vs_link_rounds"] = per_round
        out[f"{name}_vs_flat"] = statistics.median(
            r["flat_s"] / r[f"{name}_s"] for r in _rounds(result)
        )
    return out


def _rounds(result: dict[str, list[float]]) -> list[dict[str, float]]:
    keys = list(result)
    return [dict(zip(keys, values, strict=True)) for values in zip(*result.values(), strict=True)]


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
