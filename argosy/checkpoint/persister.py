"""The persister: a process per rank that owns the snapshot slots and writes them to disk.

It runs in its own session, so a SIGKILL of the training process (or its process group)
does not reach it. The trainer hands it, once, the shared-memory storages of the state's
tensors; on every `snap` it copies them into a free slot (while the trainer runs the next
forward/backward), marks the slot complete and answers `copied`. A helper thread
(writer.py) writes snapshots to disk: rank 0 picks the step and commits it, the other
ranks write the step rank 0 announced (commit.py: two-phase, fenced by epoch). A slot is
offered to that thread as soon as its copy starts (`_Slot.landing` says how far it got);
the write follows the copy closely when the trainer waits for durability (a flush, read
between the copy's pieces, or a dead trainer), else it starts once the copy ended, so it
never slows a copy the trainer may be waiting on.

When the trainer dies, the persister finishes the copy it was doing, settles the newest
snapshot (written and committed, or given up), then keeps the slots for `linger_s` so a
restarted trainer can load them from memory. It lets go at once when a newer attempt
raises the fence or adopts the slots (writes its pid as owner). Unadopted slots are
unlinked when the linger ends, so nothing leaks in /dev/shm. A `close` unlinks the slots
too, unless a newer attempt raised the fence: what they hold may be newer than anything
durable, so they are left to that attempt's load (its persister adopts them if it starts
after this one exited).

Garbage collection: the interpreter's full collections walk every object it tracks, and
torch's import alone leaves a few hundred thousand: each took 0.1 s on the 2-core VM,
holding the GIL, so one that fell inside a copy or a write stopped it (a 1,024-tensor
save's copy at 3x its usual time). What exists once the persister is set up, and again
once it has laid out and written its first step (`Writer`), is frozen (`gc.freeze`): the
collector leaves it alone from then on, and a full collection walks only what came after.

Messages in: ("sources", [tensor | None]), ("snap", step, meta_bytes, {index: bytes}),
("flush",), ("close", unlink). Out: ("ready",), ("sources_taken",) (once their file
descriptors are here: the trainer may die from then on), ("copied", step, seconds, end),
("progress", phase, bytes), ("durable", step, (write start, write end, committed) | None),
("flushed", durable, reason | None), ("error", message), ("closed",).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import mmap
import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from argosy.checkpoint.layout import SnapshotMeta, align
from argosy.checkpoint.pieces import PiecePlanner
from argosy.checkpoint.segment import (
    HEADER_BYTES,
    HELD_SLOTS,
    Header,
    Segment,
    SlotState,
    held_name,
    segment_name,
)
from argosy.checkpoint.staging import CopyProgress, write_snapshot
from argosy.checkpoint.writer import Writer
from argosy.core.procs import pid_alive

_ADOPT_WAIT_S = 10.0
_DEBRIS_AGE_S = 60.0
_PAGE_BYTES = mmap.PAGESIZE
"""A slot file smaller than a header and older than this is a crashed creation's debris."""


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
    epoch: int


class _Slot:
    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.step: int | None = None
        self.meta: SnapshotMeta | None = None
        self.persisting = False
        self.stale = False
        """Newer than the step the ranks resumed from: never to be committed."""
        self.landing: CopyProgress | None = None
        """While the snapshot is being copied in: how far it got (the disk writer follows)."""
        self.data = torch.frombuffer(segment.map, dtype=torch.uint8)[HEADER_BYTES:]


class Persister:
    def __init__(self, spec: PersisterSpec, conn: Any) -> None:
        self.spec = spec
        self.conn = conn
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.slots: list[_Slot] = []
        self.sources: list[torch.Tensor | None] = []
        self.pieces = PiecePlanner()
        self.writer = Writer(spec, self)
        self.deferred: collections.deque[tuple] = collections.deque()
        """Messages read during a copy (while looking for a flush), handled after it."""

    # -- messages -----------------------------------------------------------------------

    def send(self, *msg: Any) -> None:
        # the trainer may be gone; the persister then carries on alone
        if self.conn is None:
            return
        with self.send_lock, contextlib.suppress(OSError, EOFError):
            self.conn.send(msg)

    def serve(self) -> None:
        # slow imports before `ready`: until then the trainer counts our CPU time as progress
        import torch.distributed.checkpoint.filesystem  # noqa: F401

        self._adopt_existing()
        gc.freeze()  # see the module docstring
        self.thread = threading.Thread(target=self.writer.run, daemon=True)
        self.thread.start()
        self.send("ready")
        while True:
            try:
                if self.deferred:
                    msg = self.deferred.popleft()
                elif self.conn is None:
                    raise EOFError
                else:
                    msg = self.conn.recv()
            except (EOFError, OSError):
                self._orphaned()
                return
            kind = msg[0]
            if kind == "sources":
                self.sources = msg[1]
                self.send("sources_taken")  # the trainer may die now: we hold their fds
                _map_in_background(self.sources)
            elif kind == "snap":
                self._snap(msg[1], msg[2], msg[3])
            elif kind == "held":
                self._adopt_held(Path(msg[1]))
            elif kind == "forget_after":
                self._forget_after(msg[1])
            elif kind == "flush":
                self._want_flush()
            elif kind == "close":
                self._close(unlink=msg[1])
                return

    def _want_flush(self) -> None:
        with self.cond:
            self.writer.want_flush()
            self.cond.notify_all()

    def _read_flush(self) -> None:
        """During a copy: a flush that came meanwhile is taken at once (the disk write
        then follows the copy closely); other messages wait for the copy to end."""
        try:
            while self.conn is not None and self.conn.poll(0):
                msg = self.conn.recv()
                if msg[0] == "flush":
                    self._want_flush()
                else:
                    self.deferred.append(msg)
        except (EOFError, OSError):  # the trainer is gone: the serve loop finds out next
            return

    # -- slots --------------------------------------------------------------------------

    def _path(self, slot: int) -> Path:
        return Path(self.spec.shm_dir) / segment_name(self.spec.job, self.spec.rank, slot)

    def _adopt_existing(self) -> None:
        """Claim slots left by an earlier persister once it lets go of them (a fenced one
        does within a fraction of a second); slots still held after `_ADOPT_WAIT_S` are
        left to their owner (and readable) until the first snapshot replaces the file."""
        found: list[tuple[Path, Segment, int]] = []
        paths = [self._path(index) for index in range(self.spec.slots)]
        for held in self._held_paths():
            holder = _owner_of(held)  # 0: no header yet (a trainer is creating it): not ours
            if holder != 0 and not pid_alive(holder):  # a dead trainer's own copies
                paths.append(held)
        for path in paths:
            if not path.exists():
                continue
            try:
                seg = Segment.open(path, writable=True)
            except (OSError, ValueError):  # smaller than a header: maybe being created now
                _unlink_debris(path)
                continue
            found.append((path, seg, _owner(seg)))
        deadline = time.monotonic() + _ADOPT_WAIT_S
        owners = {pid for _, _, pid in found if pid not in (0, os.getpid())}
        while owners and time.monotonic() < deadline:
            owners = {pid for pid in owners if pid_alive(pid)}
            time.sleep(0.05)
        for _path, seg, pid in found:
            if pid in owners:  # still alive and holding it: never share a live slot; the
                seg.close()  # trainer may still load it, the first snap replaces the file
                continue
            self.slots.append(_adopt(seg))

    def _ensure_slots(self, need: int) -> None:
        """Every slot able to hold `need` bytes. A slot that holds them is kept; one made
        anew (a GB costs ~1.5 s to allocate and touch) gets a MiB of room to spare, so a
        state whose objects grow a little from step to step keeps its slots."""
        size = HEADER_BYTES + align(need + (1 << 20))
        for index in range(self.spec.slots):
            if index < len(self.slots) and self.slots[index].segment.capacity() >= need:
                continue
            if index < len(self.slots):
                old = self.slots[index]
                with self.cond:  # never resize a slot the disk writer is reading
                    while old.persisting:
                        self.cond.wait()
                    old.step, old.meta = None, None
                del old.data
                _unlink_if_ours(old.segment)  # an adopted held slot has a name of its own
                old.segment.close()
            path = self._path(index)
            path.unlink(missing_ok=True)  # a fresh file: a reader's mapping stays whole
            seg = Segment.create(path, size, lambda n: self.writer.progress(n, "allocate"))
            seg.write_header(Header(SlotState.EMPTY, -1, 0, 0, 0, os.getpid()))
            slot = _Slot(seg)
            if index < len(self.slots):
                self.slots[index] = slot
            else:
                self.slots.append(slot)

    def _pick_slot(self, need: int) -> _Slot:
        """The free slot (big enough) holding the oldest step, sparing a step rank 0 has
        announced and this rank has not written yet; waits while every slot is persisted."""
        with self.cond:
            while True:
                free = [s for s in self.slots if not s.persisting and s.segment.capacity() >= need]
                spare = [s for s in free if s.step not in self.writer.open_intents]
                if free:
                    chosen = min(spare or free, key=lambda s: -1 if s.step is None else s.step)
                    chosen.step, chosen.meta, chosen.stale = None, None, False
                    return chosen
                self.cond.wait()

    def _snap(self, step: int, meta_bytes: bytes, inline: dict[int, bytes]) -> None:
        started = time.perf_counter()
        slot = None
        try:
            meta: SnapshotMeta = pickle.loads(meta_bytes)
            need = meta.data_len + 2 * len(meta_bytes)
            self._ensure_slots(need)
            slot = self._pick_slot(need)
            landed = CopyProgress()
            with self.cond:  # the disk writer may start on it now, behind the copy
                slot.step, slot.meta, slot.landing = step, meta, landed
                self.cond.notify_all()
            copied = lambda n: self.writer.progress(n, "copy")  # noqa: E731
            try:
                write_snapshot(
                    slot.segment,
                    slot.data,
                    meta,
                    meta_bytes,
                    inline,
                    self.sources,
                    copied,
                    landed,
                    self._read_flush,
                    narrow=self.writer.hurried,  # a flush: the writer gets a core
                    planner=self.pieces,
                )
            except BaseException as err:
                landed.finish(err)
                raise
            landed.finish()
            self._landed(slot)
            self.send("copied", step, time.perf_counter() - started, time.monotonic())
        except Exception as err:  # reported to the trainer, which raises it
            traceback.print_exc()
            if slot is not None:
                self._landed(slot, failed=True)
            self.send("error", f"snapshot of step {step} failed: {err!r}")
            self.send("copied", step, time.perf_counter() - started, time.monotonic())

    def _landed(self, slot: _Slot, failed: bool = False) -> None:
        """The copy into `slot` ended; a failed one leaves nothing to persist or load (a
        disk writer already on it stops: CopyFailedError)."""
        with self.cond:
            slot.landing = None
            if failed:
                slot.step, slot.meta = None, None
            self.cond.notify_all()

    def _forget_after(self, step: int) -> None:
        """Drop snapshots newer than the step the ranks resumed from (a given-up history)."""
        with self.cond:
            for slot in self.slots:
                if slot.step is not None and slot.step > step:
                    slot.stale = True
                    # the header at once, even while the disk writer reads the data (it
                    # never reads the header): a later load must not find the step COMPLETE
                    head = slot.segment.header()
                    if head is not None and head.state is SlotState.COMPLETE:
                        slot.segment.write_header(replace(head, state=SlotState.EMPTY))
                    if not slot.persisting:
                        slot.step, slot.meta = None, None
            self.cond.notify_all()

    def _held_paths(self) -> list[Path]:
        shm = Path(self.spec.shm_dir)
        names = [held_name(self.spec.job, self.spec.rank, i) for i in range(HELD_SLOTS)]
        return [shm / name for name in names if (shm / name).exists()]

    def _adopt_held(self, path: Path) -> None:
        """Take over the slot the trainer filled itself while this process started (once:
        a file already among the slots is not mapped as a second slot)."""
        try:
            seg = Segment.open(path, writable=True)
        except (OSError, ValueError) as err:  # the trainer counts on it: say it is lost
            self.send(
                "error", f"the snapshot held in {path.name} was lost before the hand-over ({err})"
            )
            return
        known = next((s for s in self.slots if _same_file(seg, s.segment)), None)
        if known is not None:  # adopted before: it takes the step its header names now
            seg.close()
            self._reread(known)
            return
        slot = _adopt(seg)
        with self.cond:
            self.slots.append(slot)
            self.cond.notify_all()
        if self.conn is not None:  # the trainer goes on saving: its slots, allocated now
            self._ensure_slots(seg.capacity() - (1 << 20))

    def _reread(self, slot: _Slot) -> None:
        with self.cond:
            if slot.persisting:
                return
            slot.segment.set_owner(os.getpid())
            slot.step, slot.meta = _held_snapshot(slot.segment)
            slot.stale = False
            self.cond.notify_all()

    # -- endings ------------------------------------------------------------------------

    def _wait_persisted(self, timeout_s: float) -> None:
        """Until the newest snapshot is settled (committed or given up), or fenced."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            self.writer.urgent = True
            self.cond.notify_all()
            while time.monotonic() < deadline and self.thread.is_alive():
                busy = any(s.persisting for s in self.slots)
                if not busy and not self.writer.pending():
                    return
                self.cond.wait(0.1)

    def _stop_writer(self) -> None:
        with self.cond:
            self.writer.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=self.spec.commit_timeout_s)

    def _close(self, unlink: bool) -> None:
        self._wait_persisted(self.spec.commit_timeout_s)
        self._stop_writer()
        # fenced: a newer attempt may be about to load what we hold (never made durable,
        # since fenced writers stop): leave the slots to it, as an orphan does
        self._release(unlink and not self.writer.is_fenced())
        self.send("closed")

    def _orphaned(self) -> None:
        """The trainer died: persist what we hold (rank 0 decides, the others follow), keep
        it in memory for a restart, and let go as soon as a newer attempt fences us or
        adopts the slots."""
        self._adopt_unhanded()
        self._wait_persisted(self.spec.commit_timeout_s)
        deadline = time.monotonic() + self.spec.linger_s
        while time.monotonic() < deadline:
            adopted = any(_owner(s.segment) != os.getpid() for s in self.slots)
            if adopted or self.writer.is_fenced():
                self._stop_writer()
                self._release(unlink=False)
                return
            time.sleep(0.1)
        self._stop_writer()
        self._release_unless_fenced()

    def _adopt_unhanded(self) -> None:
        """The held slots our trainer filled and never handed over. Only while no newer
        attempt has raised the fence, checked under the fence's lock: a newer trainer
        raises it before it holds anything, and its held slots carry the same names (and,
        restarted in the same process, the same owner pid), so they are never taken."""
        try:
            fence = self.writer.fence
            with fence.locked():
                if fence.current() <= self.spec.epoch:  # read afresh, under the lock
                    for held in self._held_paths():
                        if _owner_of(held) == self.spec.parent_pid:
                            self._adopt_held(held)
        except OSError:  # no lock (an unwritable directory): the newer attempt adopts them
            return

    def _release_unless_fenced(self) -> None:
        """The linger ended: unlink the slots unless a newer attempt raised the fence since
        the last look. Decided under the fence's lock: a newer trainer raises the fence
        (under it) before it creates a held slot, and its held slots carry the same names
        as ours, so no name it reused can be unlinked here."""
        fence = self.writer.fence
        with contextlib.ExitStack() as stack:
            with contextlib.suppress(OSError):  # no lock (an unwritable directory): the
                stack.enter_context(fence.locked())  # names' own check below still holds
            self._release(unlink=fence.current() <= self.spec.epoch)

    def _release(self, unlink: bool) -> None:
        for slot in self.slots:
            del slot.data
            if unlink:
                _unlink_if_ours(slot.segment)
            slot.segment.close()
        self.slots = []


def _map_in_background(sources: list[torch.Tensor | None]) -> None:
    """Read one byte of every page of the trainer's shared storages on a helper thread, so
    the copy of the next snapshot finds them mapped (a first read of each page costs a
    fault: about 0.3 s per GB on a 2-core VM, paid inside the snapshot's copy otherwise).
    Only reads: the trainer may be changing the bytes meanwhile."""

    def touch() -> None:
        with contextlib.suppress(Exception):  # best effort: the copy faults them anyway
            for source in sources:
                if source is not None and source.device.type == "cpu":
                    pages = torch.empty(0, dtype=torch.uint8).set_(source.untyped_storage())
                    pages[::_PAGE_BYTES].max()

    threading.Thread(target=touch, name="map-sources", daemon=True).start()


def _unlink_debris(path: Path) -> None:
    """Remove a slot file smaller than a header only when it has stayed so for longer
    than a creation takes (a creator crashed between open and truncate): a younger one may
    be another process's slot being created this moment, whose snapshot an unlink drops."""
    with contextlib.suppress(OSError):
        info = path.stat()
        if info.st_size < HEADER_BYTES and time.time() - info.st_mtime > _DEBRIS_AGE_S:
            path.unlink(missing_ok=True)


def _unlink_if_ours(seg: Segment) -> None:
    """Unlink a slot's file when this process (or no one) owns it and its name still
    names that file."""
    if _owner(seg) in (os.getpid(), 0) and _names(seg):
        seg.unlink()


def _names(seg: Segment) -> bool:
    """Whether the segment's path still names the file it maps: slot names are reused (a
    newer trainer's held slots carry the names of the killed one's), so unlinking a name
    that now belongs to another file would drop that file's snapshot."""
    try:
        a, b = os.stat(seg.path), os.fstat(seg.fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _owner_of(path: Path) -> int:
    try:
        seg = Segment.open(path)
    except (OSError, ValueError):
        return 0
    try:
        return _owner(seg)
    finally:
        seg.close()


def _adopt(seg: Segment) -> _Slot:
    """A slot this persister now owns, with the step and meta the segment already holds."""
    seg.set_owner(os.getpid())
    slot = _Slot(seg)
    slot.step, slot.meta = _held_snapshot(seg)
    return slot


def _held_snapshot(seg: Segment) -> tuple[int | None, SnapshotMeta | None]:
    """(step, meta) of the complete snapshot a segment holds, else (None, None)."""
    head = seg.header()
    meta_bytes = seg.read_meta(head) if head is not None else None
    if meta_bytes is None:
        return None, None
    return head.step, pickle.loads(meta_bytes)


def _same_file(a: Segment, b: Segment) -> bool:
    """Whether two mappings are of one file (the same inode, whatever its path now)."""
    if a.fd < 0 or b.fd < 0:
        return False
    sa, sb = os.fstat(a.fd), os.fstat(b.fd)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _owner(seg: Segment) -> int:
    head = seg.header() if seg.map is not None else None
    return head.owner_pid if head else 0


class _QuietStream:
    """stderr that never raises: the log sits in the checkpoint directory, whose disk may
    be full, and a failed log line must not take the writer thread down with it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(address: str) -> None:
    """Process entry point: `python -m argosy.checkpoint.persister ADDRESS` (or
    `--standby`: started ahead, the address comes on stdin; checkpoint/standby.py)."""
    import faulthandler
    import multiprocessing
    import signal
    from multiprocessing.connection import Client

    import torch.multiprocessing  # noqa: F401  # registers the tensor-sharing reducers

    from argosy.checkpoint import standby

    if address == standby.STANDBY_ARG:  # started ahead: torch is in, now wait for a trainer
        assigned = standby.await_assignment()
        if assigned is None:
            os._exit(0)
        address = assigned
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    sys.stderr = _QuietStream(sys.stderr)
    key = bytes.fromhex(os.environ.pop("ARGOSY_PERSISTER_KEY"))
    spec = PersisterSpec(**json.loads(os.environ.pop("ARGOSY_PERSISTER_SPEC")))
    multiprocessing.current_process().authkey = key
    try:
        conn = Client(address, family="AF_UNIX", authkey=key)
    except (OSError, EOFError):
        conn = None  # the trainer died before or during the handshake: act as its orphan
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
