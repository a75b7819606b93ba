"""The persister's disk-writing thread: phase 1 on every rank, phase 2 on rank 0.

Rank 0 (the coordinator) decides which step is written: the newest complete snapshot it
holds, once `persist_interval_s` has passed (at once for a flush, a close or a dead
trainer). It announces the step by creating the staging directory, writes its shard,
waits for every rank's done-marker and commits (commit.py). The other ranks (followers)
never choose: they write the step rank 0 announced when they still hold it, else refuse
it, so no two ranks ever spend a write on different steps.

Every write checks the fence (a newer attempt stops this one within one chunk) and
reports progress (bytes copied, written, or seen arriving from the other ranks) to the
trainer, which shows it to the watchdog.

The thread talks to its persister through a small host interface: `slots`, `cond`
(guarding slot state), `send(*msg)`.
"""

from __future__ import annotations

import gc
import pickle
import time
import traceback
from pathlib import Path
from typing import Any, Protocol

from argosy.checkpoint import commit as cm
from argosy.checkpoint import disk, faultpoints
from argosy.checkpoint.layout import SnapshotMeta
from argosy.checkpoint.staging import CopyFailedError

_POLL_S = 0.05
_PROGRESS_EVERY_S = 0.2
_BELOW_WHEN_BACKGROUND = 10


class Host(Protocol):
    slots: list[Any]
    cond: Any

    def send(self, *msg: Any) -> None: ...


class Writer:
    """State of the disk writer of one rank; `run()` is the thread's body."""

    def __init__(self, spec: Any, host: Host) -> None:
        self.spec = spec
        self.host = host
        self.directory = Path(spec.directory)
        self.epoch = spec.epoch
        self.fence = cm.Fence(self.directory)
        self.coordinator = spec.rank == 0
        self.durable = max(disk.committed_steps(self.directory), default=-1)
        self.settled: dict[int, str | None] = {}
        """Steps this rank is done with: None when committed, else why not."""
        self.open_intents: set[int] = set()
        """Steps rank 0 announced that this follower has not written yet."""
        self.written: dict[int, Path] = {}
        self.flush_wanted = False
        self.flush_since = 0.0
        self.urgent = False
        self.stopping = False
        self.fenced = False
        self.last_persist = float("-inf")
        self.progress_bytes = 0
        self.last_write: tuple[float, float, float] | None = None
        """The last commit: its shard write began, ended, the step committed (monotonic)."""
        self._progress_sent = 0.0

    # -- shared helpers ---------------------------------------------------------------

    def progress(self, delta: int, phase: str) -> None:
        """Count `delta` more bytes of checkpoint work; tell the trainer now and then."""
        if delta <= 0:  # waiting is not progress: only bytes that moved count
            return
        self.progress_bytes += delta
        now = time.monotonic()
        if now - self._progress_sent >= _PROGRESS_EVERY_S:
            self._progress_sent = now
            self.host.send("progress", phase, self.progress_bytes)

    def below(self) -> int:
        """Nice levels under the process for the threads that write a shard: a background
        write runs below the trainer and the copy and takes only the CPU they leave,
        however nice the whole job runs; one the trainer waits for (a flush, a close, a
        dead trainer) runs at the job's own priority, since nothing else of the job runs
        meanwhile (below it, on a busy machine, every other process's work came first)."""
        return 0 if self.hurried() else _BELOW_WHEN_BACKGROUND

    def hurried(self) -> bool:
        """Whether the trainer now waits for the write: a background write that finds it
        so mid-way writes the rest at the job's priority (pwrite.py)."""
        return self.flush_wanted or self.urgent

    def is_fenced(self) -> bool:
        if not self.fenced and self.fence.fenced(self.epoch):
            self.fenced = True
            print(f"epoch {self.epoch} fenced by a newer attempt: writing stops", flush=True)
        return self.fenced

    def newest_slot(self) -> Any:
        held = [
            s
            for s in self.host.slots
            if s.step is not None and s.meta is not None and not getattr(s, "stale", False)
        ]
        return max(held, key=lambda s: s.step, default=None)

    def _write_shard(self, staging: Path, step: int, meta: SnapshotMeta, slot: Any) -> Any:
        """Write this rank's shard of `step` from `slot` and publish it once the copy
        ended whole (rank 0 keeps its piece: `_gather` takes it as it is). While the
        snapshot still lands there, the write follows the copy closely when someone
        waits for it (`hurried`: the copy's memory traffic is then worth sharing), else
        it waits for the whole copy (a trainer stalled on a copy must not find it slowed
        by the disk's DMA)."""
        last = [0]

        def on_write(total: int) -> None:
            self.progress(total - last[0], "write")
            last[0] = total
            faultpoints.reach("write")
            self.fence.check(self.epoch)

        def check() -> None:
            self.fence.check(self.epoch)

        check()
        landing = getattr(slot, "landing", None)  # None once the snapshot is whole
        ready = None if landing is None else lambda n: landing.wait_for(n, check, self.hurried)
        data = slot.segment.data_view(meta.data_len)
        try:
            piece = disk.write_rank(
                staging, meta, data, on_write, below=self.below(), hurry=self.hurried, ready=ready
            )
        finally:
            data.release()
        if landing is not None:
            landing.wait_for(None, check)  # the copy ended whole: the shard may be published
        check()
        faultpoints.reach("publish")
        if not self.coordinator:
            cm.publish(staging, piece, self.epoch)
        return piece

    def _release(self, slot: Any) -> None:
        with self.host.cond:
            slot.persisting = False
            self.host.cond.notify_all()

    def run(self) -> None:
        import torch.distributed.checkpoint.filesystem  # noqa: F401  # slow import, done early

        loop = self._coordinate_once if self.coordinator else self._follow_once
        while not self.stopping and not self.is_fenced():
            try:
                loop()
            except Exception:  # a bug must not kill the writer silently
                traceback.print_exc()
                time.sleep(_POLL_S)
        with self.host.cond:
            self.host.cond.notify_all()

    # -- flushes ----------------------------------------------------------------------

    def want_flush(self) -> None:
        self.flush_wanted = True
        self.flush_since = time.monotonic()

    def pending(self) -> bool:
        """Whether the newest snapshot still waits to be settled (committed or given up)."""
        slot = self.newest_slot()
        return slot is not None and slot.step > self.durable and slot.step not in self.settled

    def _answer_flush(self) -> None:
        """Answer a flush once the newest snapshot is settled: ("flushed", durable, why not)."""
        if not self.flush_wanted or any(s.persisting for s in self.host.slots):
            return
        slot = self.newest_slot()
        reason = None
        if slot is not None and slot.step > self.durable:
            if slot.step in self.settled:
                reason = self.settled[slot.step] or "not committed"
            elif time.monotonic() - self.flush_since < self.spec.commit_timeout_s:
                return
            else:
                reason = f"rank 0 did not commit it within {self.spec.commit_timeout_s:g} s"
            reason = f"step {slot.step} was not committed: {reason}"
        self.flush_wanted = False
        self.host.send("flushed", self.durable, reason)

    # -- coordinator ------------------------------------------------------------------

    def _due(self) -> Any:
        if not self.pending():
            return None
        slot = self.newest_slot()
        if self.flush_wanted or self.urgent:
            return slot
        wait = self.spec.persist_interval_s
        return slot if time.monotonic() - self.last_persist >= wait else None

    def _coordinate_once(self) -> None:
        with self.host.cond:
            slot = self._due()
            if slot is None:
                self._answer_flush()
                self.host.cond.wait(_POLL_S)
                return
            slot.persisting = True
            self.last_persist = time.monotonic()
            step, meta = slot.step, slot.meta
        try:
            reason = self._persist_as_coordinator(step, meta, slot)
        finally:
            self._release(slot)
        self.settled[step] = reason
        if reason is None:
            self.durable = max(self.durable, step)
        _freeze_once()
        self.host.send("durable", self.durable, self.last_write if reason is None else None)
        with self.host.cond:
            self._answer_flush()  # durable now: deleting older steps is no one's wait
        if reason is None:
            cm.prune(self.directory, self.spec.keep, self.epoch)

    def _persist_as_coordinator(self, step: int, meta: SnapshotMeta, slot: Any) -> str | None:
        """Phase 1 and 2 of `step`; None when committed, else why not."""
        staging = self.directory / cm.tmp_dir_name(step, self.epoch)
        try:
            self.fence.check(self.epoch)
            staging.mkdir(parents=True, exist_ok=True)  # the announcement
            started = time.monotonic()
            piece = self._write_shard(staging, step, meta, slot)
            written = time.monotonic()
            pieces = self._gather(staging, meta.world_size, piece)
            if isinstance(pieces, tuple):
                kind, reason = pieces
                cm.abort(staging, reason)
                if kind != "skip":  # a skip is the normal race of slots; retried newer
                    self._error(step, reason)
                return reason
            if getattr(slot, "stale", False):  # the ranks resumed from an older step meanwhile
                cm.abort(staging, "a newer attempt resumed from an older step")
                return "given up: the ranks resumed from an older step"
            metas = [meta] + [_rank_meta(staging, r) for r in range(1, meta.world_size)]
            cm.commit(self.directory, step, self.epoch, metas, pieces, self.fence)
            self.last_write = (started, written, time.monotonic())
            faultpoints.reach("renamed")
            return None
        except (cm.FencedError, CopyFailedError) as err:  # a failed copy: reported already
            cm.abort(staging, str(err))
            return str(err)
        except Exception as err:  # disk full, unwritable directory, ...
            traceback.print_exc()
            cm.abort(staging, f"rank 0 failed: {err}")
            self._error(step, str(err))
            return f"failed: {err}"

    def _error(self, step: int, reason: str) -> None:
        self.host.send("error", f"persisting step {step} to {self.directory} failed: {reason}")

    def _gather(self, staging: Path, world_size: int, own: Any) -> list | tuple[str, str]:
        """Every rank's piece (`own`: this rank's), or (kind, why) the step cannot be
        committed."""
        deadline = time.monotonic() + self.spec.commit_timeout_s
        seen = 0
        while True:
            got = cm.collect(staging, world_size, self.epoch, own)
            if got.pieces is not None:
                return got.pieces
            if got.refusal is not None:
                return got.refusal
            self.progress(got.bytes_seen - seen, "commit")
            seen = max(seen, got.bytes_seen)
            self.fence.check(self.epoch)
            if time.monotonic() > deadline:
                return ("timeout", f"not every rank wrote it in {self.spec.commit_timeout_s:g} s")
            time.sleep(_POLL_S)

    # -- follower ---------------------------------------------------------------------

    def _follow_once(self) -> None:
        committed = disk.committed_steps(self.directory)
        self.durable = max(self.durable, max(committed, default=-1))
        self._settle_written(set(committed))
        intents = {
            step: path
            for step, path in cm.staging_dirs(self.directory, self.epoch).items()
            if step not in self.settled
            and step not in self.written
            and step > self.durable
            and not cm.aborted(path)
        }
        self.open_intents = set(intents)
        if not intents:
            with self.host.cond:
                self._answer_flush()
                self.host.cond.wait(_POLL_S)
            return
        newest = max(intents)
        for step in intents:
            if step != newest:  # rank 0 announces one step at a time: those are stale
                cm.refuse(intents[step], self.spec.rank, "skip", f"rank moved on to {newest}")
                self.settled[step] = "superseded"
        self._follow(newest, intents[newest])

    def _follow(self, step: int, staging: Path) -> None:
        with self.host.cond:
            slot = next(
                (s for s in self.host.slots if s.step == step and s.meta and not s.stale), None
            )
            held = sorted(s.step for s in self.host.slots if s.step is not None)
            if slot is None and (not held or step > held[-1]):
                self.host.cond.wait(_POLL_S)  # not here yet (copy or hand-over under way)
                return
            if slot is None or slot.persisting:
                cm.refuse(staging, self.spec.rank, "skip", f"holds steps {held}")
                self.settled[step] = f"rank {self.spec.rank} no longer held it (holds {held})"
                return
            slot.persisting = True
            meta = slot.meta
        try:
            self._write_shard(staging, step, meta, slot)
            self.written[step] = staging
            _freeze_once()
        except cm.FencedError:
            return
        except CopyFailedError as err:  # the persister reported the failed copy already
            cm.refuse(staging, self.spec.rank, "failed", str(err))
            self.settled[step] = str(err)
        except Exception as err:
            if cm.aborted(staging):  # rank 0 gave the step up while this rank wrote it
                self.settled[step] = "aborted by rank 0"
                return
            traceback.print_exc()
            cm.refuse(staging, self.spec.rank, "failed", str(err))
            self.settled[step] = f"failed: {err}"
            self._error(step, str(err))
        finally:
            self._release(slot)

    def _settle_written(self, committed: set[int]) -> None:
        """Steps this rank wrote: settled once committed, or once rank 0 dropped them."""
        for step, staging in list(self.written.items()):
            if step in committed:
                self.settled[step] = None
            elif step <= self.durable:
                self.settled[step] = "superseded by a newer commit"
            elif cm.aborted(staging):
                if (self.directory / disk.step_dir_name(step) / disk.MANIFEST).exists():
                    self.settled[step] = None  # renamed between the listing and this look
                    self.durable = max(self.durable, step)
                else:
                    self.settled[step] = f"aborted by rank 0: {_reason(staging)}"
            else:
                continue
            del self.written[step]


_frozen = False


def _freeze_once() -> None:
    """After the first step written: what its layout and commit left behind (templates,
    imports, caches) is kept from then on; the collector leaves it alone (persister.py)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


def _reason(staging: Path) -> str:
    try:
        return (staging / cm.ABORTED).read_text(errors="replace")
    except OSError:
        return "its staging directory is gone"


def _rank_meta(staging: Path, rank: int) -> SnapshotMeta:
    meta, _ = pickle.loads((staging / f"rank{rank}.meta").read_bytes())
    return meta
