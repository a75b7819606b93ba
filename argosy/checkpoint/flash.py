"""FlashCheckpointer: step-granularity snapshots that cost the training loop almost nothing.

    ckpt = FlashCheckpointer("/ckpt/run1", keep=3)
    restored = ckpt.load(into=state)               # (step, state) or None
    for step in range(start, steps):
        loss = model(batch).sum(); loss.backward()
        ckpt.before_optimizer_step()               # fence: the last snapshot's copy is done
        opt.step(); opt.zero_grad()
        ckpt.save(step, state)                     # returns at once
    ckpt.wait(); ckpt.close()

Contract:
- `save(step, state)`: `state` is a nested dict of tensors (DTensors allowed) and picklable
  objects. It returns as soon as the loop may continue, and never waits for the persister
  to start: while it starts (the first seconds of a new process), the state is copied
  aside (up to `hold_limit_bytes`) and handed over once it is ready. The copy into a pre-allocated,
  pre-touched shared-memory slot runs in the persister process, overlapping the next
  forward/backward. On CPU the state's tensor storages are moved into shared memory once
  (like `model.share_memory()`), so the persister reads them directly, and a copy under way
  finishes even if the trainer is SIGKILLed right after `save` returns (a save of storages
  the persister has not seen yet waits until it holds their file descriptors, which
  travel through the trainer: one round trip, once per set of storages). Before it asks for
  the copy, `save` ends the trainer's idle OpenMP workers, which would spin on the cores the
  copy needs (openmp.py). Accelerator tensors are first copied on a side stream into
  pinned, shared host buffers; while the persister starts, a save of them waits for that
  copy and is held aside like CPU state (a restarted rank's first saves never wait seconds
  for the persister's torch import).
- `wait()`: blocks until the last saved step is committed. Called while the persister
  still copies that snapshot, it asks for the flush at once, so the disk write follows the
  copy instead of starting after it (`save` then `wait` is a durable save at about the
  disk's speed); without a waiting caller the write starts once the copy ended.
- `before_optimizer_step()`: call it before anything writes the saved tensors (the
  optimizer step); it waits only if the copy is not done yet. `save` calls it too.
- The persisters write snapshots to `directory` in DCP format: rank 0 picks the step, every
  rank writes its shard, rank 0 commits it in one atomic rename of a checksummed manifest
  (commit.py); the newest `keep` steps are kept. Each attempt has an epoch (`epoch`), and
  a newer attempt fences the writers of older ones out (`fence=False` for a process that
  only reads, so it leaves a running job's writers alone).
- `load(step=None, into=None)`: the newest step every rank can load, from shared memory
  when valid there, else from disk; the ranks agree on it (agree.py), so they all resume
  from the same step; a torn or changed step is skipped with a warning, for every rank.
  `last_decision` says what each rank held and what was rejected. When the world size
  changed, `into` is required and DCP reshards.
- `progress(phase, value)`, when given, is called while a checkpoint call waits on the
  persister and the persister moves (value: bytes copied, written, or arriving from other
  ranks; CPU ticks while it starts): what the runtime's hang detector follows instead of a
  flat grace. Phase "committed" carries the newest committed step.
- `hang_timeout_s`, when given, bounds every wait on the persister (a copy, a flush):
  CheckpointError once it passed (a wedged persister), for callers without a watchdog.
- Errors of the persister (disk full, unwritable directory) are raised by the next `save`
  or `wait`; earlier checkpoints are untouched.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import os
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from argosy.checkpoint import agree, disk, restore
from argosy.checkpoint.commit import Fence
from argosy.checkpoint.config import CheckpointConfig
from argosy.checkpoint.held import HeldSlots
from argosy.checkpoint.launch import PersisterHandle
from argosy.checkpoint.layout import ObjectEntry, SnapshotMeta, encode_object, flatten
from argosy.checkpoint.link import CheckpointError, PersisterLink
from argosy.checkpoint.openmp import release_idle_workers
from argosy.checkpoint.persister import PersisterSpec
from argosy.checkpoint.saveplan import SavePlanner, source_signature
from argosy.checkpoint.segment import (
    SHM_DIR,
    Segment,
    SlotState,
    job_segments,
    segment_paths,
)
from argosy.checkpoint.staging import DeviceStager
from argosy.core.errors import ArgosyError


def default_job(directory: Path) -> str:
    """Segments are named by job: explicit, from the launcher, or from the directory path."""
    explicit = os.environ.get("ARGOSY_CKPT_JOB")
    if explicit:
        return explicit
    return hashlib.sha1(str(directory).encode()).hexdigest()[:12]


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class FlashCheckpointer(PersisterLink):
    """See the module docstring for the contract."""

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 3,
        *,
        job_id: str | None = None,
        slots: int = 2,
        linger_s: float = 300.0,
        commit_timeout_s: float = 300.0,
        inline_bytes: int = 1 << 16,
        start_timeout_s: float = 120.0,
        prestart: bool = True,
        persist_interval_s: float = 0.0,
        progress: Callable[[str, int], None] | None = None,
        hold_limit_bytes: int = 1 << 30,
        fence: bool = True,
        hang_timeout_s: float | None = None,
    ) -> None:
        if keep < 1 or slots < 1:
            raise ArgosyError(f"keep and slots must be at least 1 (got keep={keep}, slots={slots})")
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.rank, self.world_size = _rank_world()
        self.job = job_id or default_job(self.directory)
        self.inline_bytes = inline_bytes
        self.start_timeout_s = start_timeout_s
        self.hold_limit_bytes = hold_limit_bytes
        self.hang_timeout_s = hang_timeout_s
        """Longest wait on the persister (a copy, a flush) before CheckpointError; None:
        no limit (the runtime's watchdog follows `progress` instead)."""
        self._progress = progress
        self.epoch = agree.agree_epoch(self.world_size)
        """This attempt's epoch: its writes are void once a newer attempt raises the fence."""
        # fence=False: a reader (evaluation, tools) must not stop a running job's writers;
        # an unwritable directory: persisting fails and says so on `wait`
        if fence:
            with contextlib.suppress(OSError):
                Fence(self.directory).raise_to(self.epoch)
        self._spec = PersisterSpec(
            str(self.directory),
            self.job,
            self.rank,
            self.world_size,
            keep,
            slots,
            linger_s,
            commit_timeout_s,
            persist_interval_s,
            str(SHM_DIR),
            os.getpid(),
            self.epoch,
        )
        self._proc: Any = None
        self._launch: PersisterHandle | None = None
        self._conn: Any = None
        self._ready = False
        self._pending: int | None = None
        self._saved: int | None = None
        self._durable = -1
        self._errors: list[str] = []
        self._signature: Any = None
        self._planner = SavePlanner(inline_bytes)
        self._sources_taken = False
        self._sources: list[Any] = []
        self._stager: DeviceStager | None = None
        self._staged: tuple[int, bytes, dict[int, bytes]] | None = None
        self._closed = False
        self._flushed: tuple[int, str | None] | None = None
        self._held = HeldSlots(self.job, self.rank)
        self._held_sources: list[Any] | None = None
        """Snapshots in our own slots, waiting for the persister (held.py)."""
        self._start_ticks: int | None = None
        self._forget: int | None = None
        self._maps = restore.MappingCache()
        self.last_copy_s: float | None = None
        """Seconds the persister took to copy the last snapshot into shared memory."""
        self.last_copy_end: float | None = None
        """When that copy ended (`time.monotonic()`, system-wide on Linux)."""
        self.last_write: tuple[float, float, float] | None = None
        """Rank 0's last commit: when its shard write began and ended and the step was
        committed (`time.monotonic()`): whether the write followed the copy, and what the
        commit cost (benchmarks/checkpoint_peers.py)."""
        self.last_load_source: str | None = None
        """Where the last `load` read from: "memory", "disk" or None."""
        self.last_decision: dict[str, Any] | None = None
        """How the last `load` chose its step: what every rank held, what was rejected."""
        if prestart:  # start-up (~1-2 s of imports) overlaps the caller's load and first steps
            self._start()
        atexit.register(self.close)

    @classmethod
    def from_config(
        cls, config: CheckpointConfig, directory: str | os.PathLike | None = None, **kwargs: Any
    ) -> FlashCheckpointer:
        """A checkpointer with the knobs of the `checkpoint` config section."""
        return cls(
            directory or config.directory,
            keep=config.keep,
            slots=config.slots,
            linger_s=config.linger_s,
            commit_timeout_s=config.commit_timeout_s,
            inline_bytes=config.inline_bytes,
            persist_interval_s=config.persist_interval_s,
            **kwargs,
        )

    # -- the training loop's side --------------------------------------------------------

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Snapshot `state` as `step`; returns once the loop may go on (see module doc)."""
        if self._closed:
            raise CheckpointError("save() after close()")
        if self._proc is None:
            self._start()
        self.before_optimizer_step()
        self._wait_copied()
        self._raise_errors()
        flat, mappings = flatten(state)
        planned = self._planner.plan(flat)
        meta = SnapshotMeta(
            step,
            self.rank,
            self.world_size,
            mappings,
            planned.entries,
            [ObjectEntry(k, encode_object(flat[k])) for k in planned.object_keys],
            planned.data_len,
        )
        on_device, signature = planned.on_device, planned.signature
        if on_device:
            self._stager = self._stager or DeviceStager()
            sources, inline = self._stager.stage(planned.tensors, self.inline_bytes)
            signature = None
        else:
            sources, inline = planned.sources, planned.inline_bytes()
        self._saved = step
        if not self._is_ready() and _nbytes(sources) <= self.hold_limit_bytes:
            if on_device:  # the held copy reads the staged host buffers, reused next save
                assert self._stager is not None
                self._stager.synchronize()
            self._held.hold(step, pickle.dumps(meta), inline, sources)
            self._held_sources = None if on_device else sources
            return
        self._pump(lambda: self._ready, self.start_timeout_s)
        self._send_forget()
        self._send_sources(sources, signature)
        if on_device:  # sent by the fence, once the device-to-host copy is done
            self._staged = (step, pickle.dumps(meta), inline)
            return
        release_idle_workers(torch.get_num_threads())  # the persister's copy needs the cores
        self._send(("snap", step, pickle.dumps(meta), inline))
        self._pending = step

    def _send_sources(self, sources: list[Any], signature: list[Any] | None = None) -> None:
        # Storage addresses identify the sources: `self._sources` keeps them alive, so an
        # address cannot be reused by another tensor while the persister holds it.
        signature = signature if signature is not None else source_signature(sources)
        if signature != self._signature:
            self._sources_taken = False
            self._send(("sources", sources))
            self._signature, self._sources = signature, sources
            # their file descriptors travel through this process (torch's file_descriptor
            # sharing): a persister still unpickling them when we die gets none, and
            # every snap after them would be lost; so wait until it holds them
            self._pump(lambda: self._sources_taken)

    def _is_ready(self) -> bool:
        """Whether the persister answered `ready` (never waits for it)."""
        if not self._ready and self._proc is not None and self._connected():
            self._drain()
        return self._ready

    def _send_held(self, block: bool) -> None:
        if not self._held or not (block or self._is_ready()):
            return
        self._pump(lambda: self._ready, self.start_timeout_s)
        self._send_forget()
        if self._held_sources is not None:  # early: the persister maps them before the next
            self._send_sources(self._held_sources)  # save, not inside its copy
            self._held_sources = None
        for path in self._held.hand_over():
            self._send(("held", path))

    def before_optimizer_step(self) -> None:
        """Fence: returns once the last snapshot no longer reads the live tensors."""
        if self._staged is not None:
            assert self._stager is not None
            self._stager.synchronize()
            step, meta_bytes, inline = self._staged
            self._staged = None
            self._send(("snap", step, meta_bytes, inline))
            self._pending = step
            return
        self._send_held(block=False)
        self._wait_copied()

    def _wait_copied(self) -> None:
        if self._pending is not None:
            self._pump(lambda: self._pending is None)

    def wait(self) -> int | None:
        """Block until the last saved step is committed on disk; returns that step.

        Raises CheckpointError when it could not be committed (after every rank has
        reached this point, so no rank is left waiting for another).
        """
        if self._staged is not None:
            self.before_optimizer_step()  # sends the device snapshot's snap, waits for nothing
        flushed = self._flush_early()
        self.before_optimizer_step()
        self._send_held(block=True)
        self._wait_copied()
        if self._saved is not None:  # always so after an early flush (it follows a save)
            self._pump(lambda: self._ready, self.start_timeout_s)
            self._send_forget()
            if not flushed:
                self._flushed = None
                self._send(("flush",))
            self._pump(lambda: self._flushed is not None)
            durable, reason = self._flushed
            if reason is None and durable < self._saved:  # the persister never held it
                reason = (
                    f"step {self._saved} was not committed (the newest durable step is"
                    f" {durable}): the persister does not hold it"
                )
            if reason is not None:
                self._errors.append(reason)
        self._drain()
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
        self._raise_errors()
        return self._saved

    def _flush_early(self) -> bool:
        """While the persister still copies the last snapshot, ask for the flush at once:
        it reads it between the copy's pieces and its disk write then follows the copy
        closely instead of starting after it. Only then (nothing else is owed before a
        flush: no held slots to hand over, no forget); True when it was sent."""
        if self._pending is None or self._held or self._forget is not None:
            return False
        self._flushed = None
        self._send(("flush",))
        return True

    @property
    def persister_pid(self) -> int | None:
        """The pid of this rank's persister process (None before it started)."""
        return None if self._proc is None else self._proc.pid

    def latest_step(self) -> int | None:
        """The newest step this rank could load (memory or disk), without loading it."""
        steps = [s.step for s in restore.memory_slots(self.job, self.rank)]
        steps += disk.committed_steps(self.directory)
        return max(steps, default=None)

    # -- restore ------------------------------------------------------------------------

    def load(
        self, step: int | None = None, into: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The newest complete step (or `step`) as (step, state), or None when there is none.

        Collective under torch.distributed: every rank returns the same step (agree.py);
        `last_decision` records how it was chosen.
        """
        self.before_optimizer_step()
        self._wait_copied()
        slots = restore.memory_slots(self.job, self.rank)
        on_disk = set(disk.committed_steps(self.directory))

        def read(chosen: int, from_memory: bool) -> tuple[int, dict[str, Any]]:
            if from_memory:
                slot = next(s for s in slots if s.step == chosen)
                result = restore.read_memory(slot, into, self._maps)
                if result is None:
                    raise agree.UnreadableError(f"snapshot of step {chosen} changed in memory")
                return result
            try:
                return self._load_disk(chosen, into)
            except disk.TornCheckpointError as err:
                raise agree.UnreadableError(str(err)) from err

        decision = agree.resume({s.step for s in slots}, on_disk, step, read, self.world_size)
        self.last_decision = decision.record() | {"epoch": self.epoch}
        for rejected in decision.rejected:
            mine = rejected["problems"].get(self.rank)
            said = mine or "; ".join(f"rank {r}: {p}" for r, p in rejected["problems"].items())
            warnings.warn(
                f"skipping {rejected['source']} step {rejected['step']}: {said}", stacklevel=2
            )
        self.last_load_source = decision.source
        self._forget_after(-1 if decision.step is None else decision.step)
        return decision.result

    def _forget_after(self, step: int) -> None:
        """Snapshots newer than the step all ranks resumed from belong to a history that was
        given up: mark them empty (for later loads) and have the persister drop them, so
        they are never committed nor loaded."""
        for path in segment_paths(self.job, self.rank):
            with contextlib.suppress(OSError, ValueError):
                seg = Segment.open(path, writable=True)
                try:
                    head = seg.header()
                    if head is not None and head.state is SlotState.COMPLETE and head.step > step:
                        seg.write_header(dataclasses.replace(head, state=SlotState.EMPTY))
                finally:
                    seg.close()
        self._forget = step
        if self._saved is not None and self._saved > step:  # given up: nothing to wait for
            self._saved = None
        if self._ready:
            self._send_forget()

    def _send_forget(self) -> None:
        if self._forget is not None:
            self._send(("forget_after", self._forget))
            self._forget = None

    def _load_disk(self, step: int, into: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        step_dir = self.directory / disk.step_dir_name(step)
        saved_world = int(disk.read_manifest(step_dir).get("world_size", 1))
        if saved_world == self.world_size:
            return restore.read_disk(step_dir, self.rank, into)
        if into is None:
            raise ArgosyError(
                f"step {step} was saved by {saved_world} ranks and {self.world_size} load it: "
                "pass into=<state to fill> so the checkpoint can be resharded"
            )
        return restore.read_resharded(step_dir, into)

    # -- ending -------------------------------------------------------------------------

    def close(self, timeout_s: float = 600.0) -> None:
        """Wait for the last snapshot to be durable, stop the persister, free shared memory."""
        atexit.unregister(self.close)
        self._maps.close()
        self._planner.last = None  # the plan holds the state's tensors
        if self._proc is None:
            self._closed = True
            return
        try:
            self.before_optimizer_step()
            if self._held and self._proc.poll() is None:
                self._send_held(block=True)
            self._wait_copied()
            if self._proc.poll() is None and self._connected():
                self._send(("close", True))
                self._pump(lambda: self._closed, timeout_s)
        finally:
            self._closed = True
            try:
                self._proc.wait(timeout=10)
            except Exception:  # subprocess.TimeoutExpired: it would not stop; end it
                self._proc.kill()
                self._proc.wait()
            if self._launch is not None:
                self._launch.close()
            self._proc = None
            if self._stager is not None:
                self._stager.close()
        self._raise_leftover_errors()

    def _raise_leftover_errors(self) -> None:
        if self._errors:
            errors, self._errors = self._errors, []
            raise CheckpointError("; ".join(errors))

    def __enter__(self) -> FlashCheckpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _nbytes(sources: list[Any]) -> int:
    return sum(s.numel() * s.element_size() for s in sources if s is not None)


def reclaim(job: str) -> list[Path]:
    """Remove every shared-memory segment of `job` (for tools; live owners must be gone)."""
    removed = []
    for path in job_segments(job):
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
