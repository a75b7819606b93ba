"""Shared-host-memory collectives among ranks of one host (all-reduce, one-way copy).

`ShmGroup(ranks)` maps one shared segment for `ranks` (global ranks, all on this host;
every rank of the job calls the constructor at the same point, as with `new_group`). The
segment is created by the group's first rank, attached by the others, and unlinked from
/dev/shm as soon as every member has mapped it: the mapping lives while a member does,
and a crash (even SIGKILL) leaves no file behind. The one window left, a creator killed
between creating and unlinking, leaves a file named after its pid, which the next
creator on the host removes (`sweep_stale`).

`all_reduce(t)`: in-place sum over the group, `chunk_bytes` at a time through
double-buffered slots (the segment is preallocated and reused across calls):

1. publish: rank i copies the slices of its chunk that other ranks reduce (all but slice
   i) into its input slot, then raises its `published` flag;
2. reduce-scatter: once every flag is up, rank i sums slice i into the shared result
   slot (its own part read from its tensor, the others' from their slots, in rank
   order), then raises `reduced`;
3. all-gather: once every rank has reduced, rank i copies the whole result into its
   tensor.

Two flag waits per chunk and no acknowledgement: slots alternate by chunk parity, and a
rank that sees every `published` flag of chunk k knows every rank has finished chunk k-2,
whose slots chunk k reuses.

Bytes touched per rank, for B-byte tensors and n ranks: its own tensor read once (B)
and written once (B); in the segment, (n-1)/n B written (publish), then for the sum
(n-1)/n B read from the others' slots, B/n written and (n-2)/n B read and rewritten
(the adds past the first), then B read (gather): 4.5 B for 2 ranks, 5.3 B for 3. A
one-way copy (`send` / `recv`) touches 4 B in all: B read and B written on each side.

`send(t, dst)` / `recv(t, src)`: one-way copy through the same slots, pipelined (the
writer fills chunk k+1 while the reader drains chunk k): the floor of this transport.

Waits spin briefly, then yield, then sleep in doubling steps up to 1 ms (ranks share
cores: a waiting rank must not take the core from the one it waits for). A wait
checks every ~50 ms that the ranks it waits on are alive (pid recorded in the segment,
/proc state) and raises `ShmPeerError` when one died, or when `timeout_s` passes.
Flag order relies on the host's store ordering (x86-64 TSO: data stores are visible
before the flag store that follows them).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from argosy.core.own_files import shared_memory_dir
from argosy.core.procs import pid_alive

SHM_DIR = shared_memory_dir()  # /dev/shm where this user can write there
PREFIX = "argosy-ar-"
_LINE = 64  # one flag per cache line: no false sharing between writers
_FLAGS = 4  # published, reduced, sent, drained
SPIN, YIELDS = 100, 200  # a wait spins, then yields the core, then sleeps:
SLEEP_MIN_S, SLEEP_MAX_S = 5e-6, 1e-3  # doubling from SLEEP_MIN_S up to SLEEP_MAX_S


class ShmPeerError(RuntimeError):
    """A rank of a shared-memory group died, or a wait passed its timeout."""


def host_id() -> str:
    """This host (hostname and boot id): ranks with equal ids share /dev/shm."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return f"{os.uname().nodename}/{boot.read_text().strip() if boot.exists() else ''}"


def sweep_stale() -> list[str]:
    """Remove segment files whose creating process is gone (one killed between creating
    and unlinking its segment: the only window a file can outlive its group)."""
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        try:
            pid = int(path.name[len(PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not pid_alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


class ShmGroup:
    """Collectives over a shared segment among `ranks` (global ranks on this host)."""

    def __init__(
        self,
        ranks: list[int],
        chunk_bytes: int = 4 * 2**20,
        timeout_s: float = 60.0,
        pg: dist.ProcessGroup | None = None,
    ) -> None:
        """`pg`: a gloo group of exactly `ranks`, used once to share the segment's name
        (created here when not given; then every rank of the job must call this)."""
        self.ranks = sorted(ranks)
        self.size = len(self.ranks)
        self.timeout_s = timeout_s
        if pg is None:
            pg = dist.new_group(self.ranks, backend="gloo")
        me = dist.get_rank()
        self.index = self.ranks.index(me) if me in self.ranks else -1
        self.slot = -(-max(chunk_bytes, _LINE) // _LINE) * _LINE
        self._set = (self.size + 1) * self.slot  # n input slots + 1 result slot
        header = _LINE * self.size * (_FLAGS + 1)
        self._data_at = -(-header // 4096) * 4096
        self.nbytes = self._data_at + 2 * self._set
        self._gen = 0  # all-reduce chunks so far (equal on every member)
        self._p2p = 0  # send/recv chunks so far (groups of two)
        self._mm: mmap.mmap | None = None
        if self.index < 0:
            return
        self._attach(pg)

    # -- setup ---------------------------------------------------------------------------

    def _attach(self, pg: dist.ProcessGroup) -> None:
        name = [f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}" if self.index == 0 else ""]
        path = SHM_DIR / name[0]
        if self.index == 0:
            sweep_stale()
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, self.nbytes)
        dist.broadcast_object_list(name, src=self.ranks[0], group=pg)
        path = SHM_DIR / name[0]
        try:
            if self.index != 0:
                fd = os.open(path, os.O_RDWR)
            self._mm = mmap.mmap(fd, self.nbytes)
            os.close(fd)
        finally:
            dist.barrier(group=pg)  # every member mapped it (or failed): unlink
            if self.index == 0:
                path.unlink(missing_ok=True)
        flags = np.frombuffer(self._mm, dtype=np.int64, count=self._data_at // 8)
        self._flags = flags.reshape(-1, _LINE // 8)[:, 0]  # one int64 per line
        self._pid = self._flags[_FLAGS * self.size :]
        self._pid[self.index] = os.getpid()
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        dist.barrier(group=pg)  # pids written
        self.pids = [int(p) for p in self._pid[: self.size]]

    def close(self) -> None:
        """Unmap the segment (its file is already gone)."""
        if self._mm is not None:
            self._bytes = self._flags = self._pid = None  # type: ignore[assignment]
            with contextlib.suppress(BufferError):  # a view still alive: unmapped at exit
                self._mm.close()
            self._mm = None

    # -- layout --------------------------------------------------------------------------

    def _flag(self, kind: int, index: int) -> int:
        return kind * self.size + index

    def _region(self, parity: int, slot: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        start = self._data_at + parity * self._set + slot * self.slot
        return self._bytes[start : start + numel * dtype.itemsize].view(dtype)

    # -- waits ---------------------------------------------------------------------------

    def _wait(self, kind: int, indices: list[int], gen: int) -> None:
        flags = self._flags
        todo = [self._flag(kind, i) for i in indices]
        spins = 0
        nap = SLEEP_MIN_S
        start = time.monotonic()
        check = start + 0.05
        while True:
            todo = [f for f in todo if flags[f] < gen]
            if not todo:
                return
            spins += 1
            if spins < SPIN:
                continue
            if spins < SPIN + YIELDS:
                os.sched_yield()
                continue
            nap = min(SLEEP_MAX_S, nap * 2)  # a peer far behind: wake up less often
            time.sleep(nap)
            now = time.monotonic()
            if now >= check:
                check = now + 0.05
                self._check_peers(todo, kind, gen, now - start)

    def _check_peers(self, todo: list[int], kind: int, gen: int, waited: float) -> None:
        waiting_on = [f - kind * self.size for f in todo]
        for i in waiting_on:
            if not pid_alive(self.pids[i]):
                raise ShmPeerError(
                    f"shared-memory all-reduce: rank {self.ranks[i]} (pid {self.pids[i]}) "
                    f"died; rank {self.ranks[self.index]} was waiting for it at step {gen}"
                )
        if waited > self.timeout_s:
            late = [self.ranks[i] for i in waiting_on]
            raise ShmPeerError(
                f"shared-memory all-reduce: ranks {late} did not reach step {gen} within "
                f"{self.timeout_s:.0f} s (rank {self.ranks[self.index]} waiting)"
            )

    # -- all-reduce ----------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` (contiguous, on the CPU) in place over the group; returns it."""
        if self._mm is None:
            raise RuntimeError("this rank is not a member of the shared-memory group")
        flat = tensor.view(-1)
        step = max(1, self.slot // flat.element_size())
        for begin in range(0, flat.numel(), step):
            self._all_reduce_chunk(flat[begin : begin + step])
        return tensor

    def _bounds(self, numel: int) -> list[int]:
        return [numel * i // self.size for i in range(self.size + 1)]

    def _all_reduce_chunk(self, chunk: torch.Tensor) -> None:
        n, me = self.size, self.index
        if n == 1:
            return
        self._gen += 1
        gen, parity = self._gen, self._gen % 2
        bounds = self._bounds(chunk.numel())
        everyone = list(range(n))
        mine = self._region(parity, me, chunk.dtype, chunk.numel())
        for j in everyone:  # publish what the others reduce
            if j != me:
                mine[bounds[j] : bounds[j + 1]].copy_(chunk[bounds[j] : bounds[j + 1]])
        self._flags[self._flag(0, me)] = gen
        self._wait(0, everyone, gen)
        lo, hi = bounds[me], bounds[me + 1]
        parts = [  # slice `me` of every rank's chunk, in rank order
            chunk[lo:hi] if q == me else self._region(parity, q, chunk.dtype, chunk.numel())[lo:hi]
            for q in everyone
        ]
        result = self._region(parity, n, chunk.dtype, chunk.numel())
        total = result[lo:hi]  # summed in the shared slot: the private tensor is read once
        torch.add(parts[0], parts[1], out=total)
        for part in parts[2:]:
            total.add_(part)
        self._flags[self._flag(1, me)] = gen
        self._wait(1, everyone, gen)
        chunk.copy_(result)  # every slice, this rank's too: written once

    # -- one-way copy (the transport's floor) ----------------------------------------------

    def _peer(self, rank: int) -> int:
        if self.size != 2 or self._mm is None:
            raise RuntimeError("send/recv: only between the two members of a group of two")
        return self.ranks.index(rank)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Copy `tensor` to global rank `dst` (which calls `recv`), chunk by chunk; in a
        group of two, not concurrently with an all-reduce on the same group."""
        peer = self._peer(dst)
        flat = tensor.view(-1)
        step = max(1, self.slot // flat.element_size())
        for begin in range(0, flat.numel(), step):
            piece = flat[begin : begin + step]
            self._p2p += 1
            if self._p2p > 2:  # the slot of chunk k-2 is drained
                self._wait(3, [peer], self._p2p - 2)
            self._region(self._p2p % 2, 0, piece.dtype, piece.numel()).copy_(piece)
            self._flags[self._flag(2, self.index)] = self._p2p
        if self._p2p > 0:
            self._wait(3, [peer], self._p2p)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Receive `tensor` from global rank `src` (which calls `send`)."""
        peer = self._peer(src)
        flat = tensor.view(-1)
        step = max(1, self.slot // flat.element_size())
        for begin in range(0, flat.numel(), step):
            piece = flat[begin : begin + step]
            self._p2p += 1
            self._wait(2, [peer], self._p2p)
            piece.copy_(self._region(self._p2p % 2, 0, piece.dtype, piece.numel()))
            self._flags[self._flag(3, self.index)] = self._p2p
