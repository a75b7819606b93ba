"""Hierarchical all-reduce across chip groups of different vendors.

Each chip group reduces inside itself with its native backend (`native_backend`: gloo on
CPU, NCCL on CUDA/ROCm, HCCL on Ascend, ...), the group leaders (first rank of each
group) all-reduce among themselves, and each leader broadcasts the sum back to its
group. The exchange runs over gloo (`transport="tcp"`, any hosts) or through a shared
memory segment (`transport="shm"`, `shm.py`: the exchanging ranks on one host, which
every vendor reaches through host memory; a device tensor is staged through a host
copy). With shared memory, a CPU group's ranks all join the exchange themselves
(`host_groups_join`, default on): host memory is their device memory, so that group has
no reduce or broadcast phase.

Tensors are cut into chunks that flow through the three phases as a pipeline, one thread
per phase and one process group per phase, so chunk k+1 reduces inside the group while
chunk k crosses between leaders (each process group sees its calls in one fixed order on
every rank, which keeps the collectives matched). Sums, not means: the caller weights.

    ar = HierarchicalAllReduce(group_of_rank=[0, 1, 1], device_backend="cpu")
    ar.all_reduce(t).wait()                       # t is now the sum over every rank
    ddp.register_comm_hook(HookState(ar, weight=0.5), hierarchical_hook)   # plain PyTorch
    sync = GradSync(model, ar, weight=0.5)        # argosy runtime path (see gradsync.py)
    ar.close()

Every rank must construct it at the same point (it creates process groups).

Link emulation (`cross_link_bytes_per_s`): on one host every link is the same loopback,
where a real mixed cluster joins its vendor groups over a link much slower than the ones
inside each group. With it set, each chunk's exchange between leaders lasts at
least its ring traffic (2 (n-1) / n x chunk bytes per leader) at that rate: the real
exchange runs, then the phase sleeps to that deadline. EMULATION, reported as such.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from argosy.plugins.registry import Registry
from argosy.runtime.mixed.shm import ShmGroup, host_id


@dataclass(frozen=True)
class CollectiveBackend:
    """The torch.distributed backend a device family reduces with inside its group."""

    name: str


collective_backends: Registry[CollectiveBackend] = Registry("collective backend")
collective_backends.register("cpu", CollectiveBackend("gloo"), aliases=("host",))
collective_backends.register("cuda", CollectiveBackend("nccl"), aliases=("nvidia",))
collective_backends.register("rocm", CollectiveBackend("nccl"), aliases=("amd", "hip"))
collective_backends.register("npu", CollectiveBackend("hccl"), aliases=("ascend",))
collective_backends.register("xpu", CollectiveBackend("xccl"), aliases=("intel",))

CROSS_GROUP_BACKEND = "gloo"
TRANSPORTS = ("tcp", "shm")
TRANSPORT_ENV = "ARGOSY_ALLREDUCE_TRANSPORT"
DEFAULT_CHUNK_BYTES = 4 * 2**20


def native_backend(device_backend: str) -> str:
    """The torch.distributed backend for a device backend name (unknown names list known)."""
    return collective_backends.get(device_backend).name


@dataclass
class _Chunk:
    tensor: torch.Tensor
    request: _Request


class _Request:
    """One all_reduce call: its future is set when the last chunk is broadcast."""

    def __init__(self, tensor: torch.Tensor, chunks: int) -> None:
        self.tensor = tensor
        self.left = chunks
        self.future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def chunk_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.future.set_result(self.tensor)


class HierarchicalAllReduce:
    """In-place sum over all ranks: intra-group reduce, leader all-reduce, broadcast."""

    def __init__(
        self,
        group_of_rank: list[int],
        device_backend: str | list[str] = "cpu",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        cross_link_bytes_per_s: float | None = None,
        transport: str | None = None,
        host_groups_join: bool = True,
        timeout_s: float = 60.0,
    ) -> None:
        """`transport`: how the exchange crosses between groups, "tcp" (gloo) or "shm"
        (a shared segment; every exchanging rank must be on this host). With "shm" and
        `host_groups_join`, every rank of a CPU group joins the exchange itself (its
        memory is host memory: no reduce to, nor broadcast from, its leader).
        None: `ARGOSY_ALLREDUCE_TRANSPORT` (how argosy's runtime picks it), else "tcp".
        `timeout_s`: how long a shared-memory wait lasts before it raises."""
        transport = transport or os.environ.get(TRANSPORT_ENV) or "tcp"
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: expected one of {TRANSPORTS}")
        self.transport = transport
        self.rank = dist.get_rank()
        if cross_link_bytes_per_s is not None and cross_link_bytes_per_s <= 0:
            raise ValueError(f"cross_link_bytes_per_s {cross_link_bytes_per_s}: expected > 0")
        self.cross_link_bytes_per_s = cross_link_bytes_per_s
        if len(group_of_rank) != dist.get_world_size():
            raise ValueError(
                f"group_of_rank has {len(group_of_rank)} entries; world size is "
                f"{dist.get_world_size()}"
            )
        self.chunk_bytes = chunk_bytes
        ids = sorted(set(group_of_rank))
        self.members = {g: [r for r, x in enumerate(group_of_rank) if x == g] for g in ids}
        kinds = [device_backend] * len(ids) if isinstance(device_backend, str) else device_backend
        self.group = group_of_rank[self.rank]
        self.leader = self.members[self.group][0]
        self.is_leader = self.rank == self.leader
        joins = {
            g: transport == "shm" and host_groups_join and native_backend(k) == "gloo"
            for g, k in zip(ids, kinds, strict=True)
        }
        self._reduce_pg = self._bcast_pg = None
        for g, kind in zip(ids, kinds, strict=True):  # every rank creates every group
            backend = native_backend(kind)
            reduce_pg = dist.new_group(self.members[g], backend=backend)
            bcast_pg = dist.new_group(self.members[g], backend=backend)
            if g == self.group:
                self._reduce_pg, self._bcast_pg = reduce_pg, bcast_pg
        self.exchange_ranks = sorted(
            r for g in ids for r in (self.members[g] if joins[g] else self.members[g][:1])
        )
        """Ranks in the cross-group exchange: group leaders, or every rank of a joining
        host group."""
        self.joined = joins[self.group]
        self.group_size = 1 if self.joined else len(self.members[self.group])
        self.num_groups = len(ids)
        self.in_exchange = self.rank in self.exchange_ranks
        self._shm: ShmGroup | None = None
        self._leaders_pg = None
        if transport == "shm":
            self._shm = self._shm_group(timeout_s)
        else:
            self._leaders_pg = dist.new_group(self.exchange_ranks, backend=CROSS_GROUP_BACKEND)
        self._queues: list[queue.Queue] = [queue.Queue() for _ in range(3)]
        self._failed: BaseException | None = None
        phases = (self._reduce, self._exchange, self._broadcast)
        self._threads = [
            threading.Thread(target=self._loop, args=(i, fn), daemon=True, name=f"hier-ar-{i}")
            for i, fn in enumerate(phases)
        ]
        for t in self._threads:
            t.start()

    # -- public --------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Start summing `tensor` (contiguous) in place over every rank; returns a future."""
        if self._failed is not None:
            raise RuntimeError("hierarchical all-reduce failed earlier") from self._failed
        flat = tensor.view(-1)
        step = max(1, self.chunk_bytes // max(1, flat.element_size()))
        pieces = list(flat.split(step)) or [flat]
        request = _Request(tensor, len(pieces))
        for piece in pieces:
            self._queues[0].put(_Chunk(piece, request))
        return request.future

    def close(self) -> None:
        """Stop the phase threads (after the queued work is done), unmap shared memory."""
        self._queues[0].put(None)
        for t in self._threads:
            t.join(timeout=60)
        if self._shm is not None:
            self._shm.close()

    def _shm_group(self, timeout_s: float) -> ShmGroup:
        hosts: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, host_id())
        where = {hosts[r] for r in self.exchange_ranks}
        if len(where) > 1:
            raise ValueError(
                f"transport 'shm': the exchanging ranks {self.exchange_ranks} are on "
                f"{len(where)} hosts; shared memory needs one (use transport 'tcp')"
            )
        return ShmGroup(self.exchange_ranks, chunk_bytes=self.chunk_bytes, timeout_s=timeout_s)

    # -- phases --------------------------------------------------------------------------

    def _loop(self, index: int, phase: Any) -> None:
        source = self._queues[index]
        sink = self._queues[index + 1] if index + 1 < len(self._queues) else None
        while True:
            item = source.get()
            if item is None:
                if sink is not None:
                    sink.put(None)
                return
            if self._failed is None:
                try:
                    phase(item.tensor)
                except (RuntimeError, ValueError) as err:  # a peer died or a timeout
                    self._failed = err
            if self._failed is not None:
                if not item.request.future.done():
                    item.request.future.set_exception(self._failed)
                continue
            if sink is not None:
                sink.put(item)
            else:
                item.request.chunk_done()

    def _reduce(self, chunk: torch.Tensor) -> None:
        if self.group_size > 1:
            dist.reduce(chunk, dst=self.leader, group=self._reduce_pg)

    def _exchange(self, chunk: torch.Tensor) -> None:
        if self.in_exchange and len(self.exchange_ranks) > 1:
            start = time.perf_counter()
            if self._shm is not None and chunk.device.type != "cpu":
                host = chunk.cpu()  # a device group's sum, staged through host memory
                chunk.copy_(self._shm.all_reduce(host))
            elif self._shm is not None:
                self._shm.all_reduce(chunk)
            else:
                dist.all_reduce(chunk, group=self._leaders_pg)
            if self.cross_link_bytes_per_s is not None:
                n = self.num_groups
                wire = 2 * (n - 1) / n * chunk.numel() * chunk.element_size()
                left = start + wire / self.cross_link_bytes_per_s - time.perf_counter()
                if left > 0:
                    time.sleep(left)

    def _broadcast(self, chunk: torch.Tensor) -> None:
        if self.group_size > 1:
            dist.broadcast(chunk, src=self.leader, group=self._bcast_pg)


@dataclass
class HookState:
    """State of `hierarchical_hook`: the all-reduce and this rank's gradient weight."""

    allreduce: HierarchicalAllReduce
    weight: float
    """samples on this rank / global batch (`weighting.rank_weights`)."""


def hierarchical_hook(
    state: HookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: weighted sum of the bucket over every rank, hierarchically.

    With `weight = samples / global batch` per rank, DDP's gradients become the gradient
    of the global-batch mean loss however unevenly the ranks split the batch. Keep the
    number of forward passes per step equal on every rank (DDP may issue collectives in
    forward): uneven sizes are fine, uneven micro-batch counts belong to `GradSync`."""
    buffer = bucket.buffer()
    buffer.mul_(state.weight)
    return state.allreduce.all_reduce(buffer)


# DDP checks the hook's annotations by identity; postponed (string) annotations fail that.
hierarchical_hook.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
)
