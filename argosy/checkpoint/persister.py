"""The persister: a process per rank that owns the snapshot slots and writes them to disk.

It runs in its own session, so a SIGKILL of the training process (or its process group)
does not reach it. The trainer hands it, once, the shared-memory storages of the state's
tensors; on every `snap` it copies them into a free slot (while the trainer runs the next
forward/backward), marks the slot complete and answers `copied`. A helper thread writes the
newest complete slot to disk in DCP format (rank 0 commits the step) and answers `durable`.

When the trainer dies, the persister finishes the copy it was doing, persists the newest
snapshot, then keeps the slots for `linger_s` so a restarted trainer can load them from
memory; a restarted persister adopts them (writes its pid as owner). Unadopted slots are
unlinked when the linger ends, so nothing leaks in /dev/shm.

Messages in: ("sources", [tensor | None]), ("snap", step, meta_bytes, {index: bytes}),
("flush",), ("close", unlink). Out: ("ready",), ("copied", step), ("durable", step),
("error", message).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from argosy.checkpoint import disk
from argosy.checkpoint.layout import SnapshotMeta, align, view_of
from argosy.checkpoint.segment import HEADER_BYTES, Header, Segment, SlotState, segment_name


@dataclass(frozen=True)
class PersisterSpec:
    directory: str
    job: str
    rank: int
    world_size: int
    keep: int
    slots: int
    linger_s: float
    commit_timeout_s: float
    persist_interval_s: float
    shm_dir: str
    parent_pid: int


class _Slot:
    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.step: int | None = None
        self.meta: SnapshotMeta | None = None
        self.persisting = False
        self.data = torch.frombuffer(segment.map, dtype=torch.uint8)[HEADER_BYTES:]


class Persister:
    def __init__(self, spec: PersisterSpec, conn: Any) -> None:
        self.spec = spec
        self.conn = conn
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.slots: list[_Slot] = []
        self.sources: list[torch.Tensor | None] = []
        self.durable = max(disk.committed_steps(Path(spec.directory)), default=-1)
        self.flush_wanted = False
        self.urgent = False
        self.last_persist = float("-inf")
        self.stopping = False
        self.directory = Path(spec.directory)

    # -- messages -----------------------------------------------------------------------

    def send(self, *msg: Any) -> None:
        # the trainer may be gone; the persister then carries on alone
        with self.send_lock, contextlib.suppress(OSError, EOFError):
            self.conn.send(msg)

    def serve(self) -> None:
        self._adopt_existing()
        threading.Thread(target=self._persist_loop, daemon=True).start()
        self.send("ready")
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self._orphaned()
                return
            kind = msg[0]
            if kind == "sources":
                self.sources = msg[1]
            elif kind == "snap":
                self._snap(msg[1], msg[2], msg[3])
            elif kind == "flush":
                with self.cond:
                    self.flush_wanted = True
                    self.cond.notify_all()
            elif kind == "close":
                self._close(unlink=msg[1])
                return

    # -- slots --------------------------------------------------------------------------

    def _path(self, slot: int) -> Path:
        return Path(self.spec.shm_dir) / segment_name(self.spec.job, self.spec.rank, slot)

    def _adopt_existing(self) -> None:
        """Claim slots left by an earlier persister; wait for it to let go of them."""
        owners = set()
        for index in range(self.spec.slots):
            path = self._path(index)
            if not path.exists():
                continue
            try:
                seg = Segment.open(path, writable=True)
            except (OSError, ValueError):
                path.unlink(missing_ok=True)
                continue
            head = seg.header()
            if head is not None and head.owner_pid not in (0, os.getpid()):
                owners.add(head.owner_pid)
            seg.set_owner(os.getpid())
            slot = _Slot(seg)
            meta_bytes = seg.read_meta(head) if head is not None else None
            if meta_bytes is not None:
                slot.step, slot.meta = head.step, pickle.loads(meta_bytes)
            self.slots.append(slot)
        deadline = time.monotonic() + max(self.spec.commit_timeout_s, 5.0)
        while owners and time.monotonic() < deadline:
            owners = {pid for pid in owners if _alive(pid)}
            time.sleep(0.05)

    def _ensure_slots(self, need: int) -> None:
        size = HEADER_BYTES + align(need + (1 << 20))
        for index in range(self.spec.slots):
            if index < len(self.slots) and self.slots[index].segment.size >= size:
                continue
            if index < len(self.slots):
                old = self.slots[index]
                with self.cond:  # never resize a slot the disk writer is reading
                    while old.persisting:
                        self.cond.wait()
                    old.step, old.meta = None, None
                del old.data
                old.segment.close()
            seg = Segment.create(self._path(index), size)
            seg.write_header(Header(SlotState.EMPTY, -1, 0, 0, 0, os.getpid()))
            slot = _Slot(seg)
            if index < len(self.slots):
                self.slots[index] = slot
            else:
                self.slots.append(slot)

    def _pick_slot(self) -> _Slot:
        """The free slot holding the oldest step; waits while every slot is being persisted."""
        with self.cond:
            while True:
                free = [s for s in self.slots if not s.persisting]
                if free:
                    chosen = min(free, key=lambda s: -1 if s.step is None else s.step)
                    chosen.step, chosen.meta = None, None
                    return chosen
                self.cond.wait()

    def _snap(self, step: int, meta_bytes: bytes, inline: dict[int, bytes]) -> None:
        started = time.perf_counter()
        try:
            meta: SnapshotMeta = pickle.loads(meta_bytes)
            self._ensure_slots(meta.data_len + 2 * len(meta_bytes))
            slot = self._pick_slot()
            seg = slot.segment
            seg.write_header(Header(SlotState.WRITING, step, meta.data_len, 0, 0, os.getpid()))
            for index, entry in enumerate(meta.tensors):
                dst = view_of(slot.data, entry)
                if index in inline:
                    _copy_bytes(dst, inline[index])
                else:
                    source = self.sources[index]
                    assert source is not None, f"no source for {entry.fqn}"
                    dst.copy_(source)
            crc = seg.write_meta(meta.data_len, meta_bytes)
            seg.write_header(
                Header(SlotState.COMPLETE, step, meta.data_len, len(meta_bytes), crc, os.getpid())
            )
            with self.cond:
                slot.step, slot.meta = step, meta
                self.cond.notify_all()
            self.send("copied", step, time.perf_counter() - started)
        except Exception as err:  # reported to the trainer, which raises it
            traceback.print_exc()
            self.send("error", f"snapshot of step {step} failed: {err!r}")
            self.send("copied", step, time.perf_counter() - started)

    # -- persisting ---------------------------------------------------------------------

    def _due(self) -> _Slot | None:
        """The slot to write now: the newest unpersisted one, once the interval has passed
        (at once when a `wait`, a close or the trainer's death asks for durability)."""
        slot = self._newest_unpersisted()
        if slot is None or self.flush_wanted or self.urgent:
            return slot
        return (
            slot if time.monotonic() - self.last_persist >= self.spec.persist_interval_s else None
        )

    def _newest_unpersisted(self) -> _Slot | None:
        ready = [s for s in self.slots if s.step is not None and s.step > self.durable]
        if not ready:
            return None
        staged = self._staged_steps()
        preferred = [s for s in ready if s.step in staged]
        return max(preferred or ready, key=lambda s: s.step)

    def _staged_steps(self) -> set[int]:
        """Steps other ranks have started writing (so this rank follows them)."""
        if self.spec.world_size == 1 or not self.directory.is_dir():
            return set()
        steps = set()
        for child in self.directory.glob(disk.TMP_PREFIX + "*"):
            try:
                steps.add(int(child.name[len(disk.TMP_PREFIX) :]))
            except ValueError:
                continue
        return steps

    def _persist_loop(self) -> None:
        import torch.distributed.checkpoint.filesystem  # noqa: F401  # slow import, done early

        # below the trainer: the disk writer takes only the CPU the training step leaves
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while True:
            with self.cond:
                slot = self._due()
                while slot is None:
                    if self.flush_wanted and self._newest_unpersisted() is None:
                        self.flush_wanted = False
                        self.send("durable", self.durable)
                    if self.stopping:
                        return
                    self.cond.wait(0.1)
                    slot = self._due()
                slot.persisting = True
                self.last_persist = time.monotonic()
                step, meta = slot.step, slot.meta
            try:
                self._persist(step, meta, slot)
                with self.cond:
                    self.durable = max(self.durable, step)
            except Exception as err:  # disk full, unwritable directory, ...
                shutil.rmtree(self.directory / disk.tmp_dir_name(step), ignore_errors=True)
                self.send("error", f"persisting step {step} to {self.directory} failed: {err}")
                with self.cond:
                    self.durable = max(self.durable, step)  # do not retry the same step forever
                    self.flush_wanted = True
            finally:
                with self.cond:
                    slot.persisting = False
                    self.cond.notify_all()
            self.send("durable", self.durable)

    def _persist(self, step: int, meta: SnapshotMeta, slot: _Slot) -> None:
        staging = self.directory / disk.tmp_dir_name(step)
        staging.mkdir(parents=True, exist_ok=True)
        data = slot.segment.data_view(meta.data_len)
        try:
            disk.write_rank(staging, meta, data)
        finally:
            data.release()
        if self.spec.rank != 0:
            return
        pieces = self._wait_for_ranks(staging, step, meta.world_size)
        if pieces is None:  # the other ranks moved on to a newer step: commit that one instead
            shutil.rmtree(staging, ignore_errors=True)
            return
        metas = [meta] + [self._rank_meta(staging, r) for r in range(1, meta.world_size)]
        disk.commit(self.directory, step, metas, pieces)
        disk.prune(self.directory, self.spec.keep)

    def _wait_for_ranks(self, staging: Path, step: int, world_size: int) -> list | None:
        """Every rank's piece of `step`; None when another rank has started a newer step
        (ranks pick their newest snapshot independently, so they can pass each other)."""
        deadline = time.monotonic() + self.spec.commit_timeout_s
        while True:
            pieces = disk.wait_for_ranks(staging, world_size, 0.5)
            if pieces is not None:
                return pieces
            if any(other > step for other in self._staged_steps()):
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every rank wrote step {step} within the commit timeout")

    @staticmethod
    def _rank_meta(staging: Path, rank: int) -> SnapshotMeta:
        meta, _ = pickle.loads((staging / f"rank{rank}.meta").read_bytes())
        return meta

    # -- endings ------------------------------------------------------------------------

    def _wait_persisted(self) -> None:
        with self.cond:
            self.urgent = True
            self.cond.notify_all()
            while self._newest_unpersisted() is not None or any(s.persisting for s in self.slots):
                self.cond.wait(0.2)

    def _close(self, unlink: bool) -> None:
        self._wait_persisted()
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self._release(unlink)
        self.send("closed")

    def _orphaned(self) -> None:
        """The trainer died: persist what we hold, then keep it in memory for a restart."""
        self._wait_persisted()
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        deadline = time.monotonic() + self.spec.linger_s
        while time.monotonic() < deadline:
            if any(_owner(s.segment) != os.getpid() for s in self.slots):
                self._release(unlink=False)
                return
            time.sleep(0.1)
        self._release(unlink=True)

    def _release(self, unlink: bool) -> None:
        for slot in self.slots:
            del slot.data
            if unlink and _owner(slot.segment) in (os.getpid(), 0):
                slot.segment.unlink()
            slot.segment.close()
        self.slots = []


def _copy_bytes(dst: torch.Tensor, payload: bytes) -> None:
    if payload:
        src = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dst.reshape(-1).view(torch.uint8).copy_(src)


def _owner(seg: Segment) -> int:
    head = seg.header() if seg.map is not None else None
    return head.owner_pid if head else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def main(address: str) -> None:
    """Process entry point: `python -m argosy.checkpoint.persister ADDRESS`."""
    import faulthandler
    import multiprocessing
    import signal
    from multiprocessing.connection import Client

    import torch.multiprocessing  # noqa: F401  # registers the tensor-sharing reducers

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    key = bytes.fromhex(os.environ.pop("ARGOSY_PERSISTER_KEY"))
    multiprocessing.current_process().authkey = key
    conn = Client(address, family="AF_UNIX", authkey=key)
    spec: PersisterSpec = conn.recv()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    try:
        Persister(spec, conn).serve()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stderr.flush()
    os._exit(0)  # everything is fsynced and released; skip the interpreter's slow teardown


if __name__ == "__main__":
    main(sys.argv[1])
