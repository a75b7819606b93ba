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
  objects. It returns as soon as the loop may continue. The copy into a pre-allocated,
  pre-touched shared-memory slot runs in the persister process, overlapping the next
  forward/backward. On CPU the state's tensor storages are moved into shared memory once
  (like `model.share_memory()`), so the persister reads them directly, and a copy under way
  finishes even if the trainer is SIGKILLed right after `save` returns. Accelerator tensors
  are first copied on a side stream into pinned, shared host buffers.
- `before_optimizer_step()`: call it before anything writes the saved tensors (the
  optimizer step); it waits only if the copy is not done yet. `save` calls it too.
- The persister writes the newest complete snapshot to `directory` in DCP format with an
  atomic, checksummed commit and keeps the newest `keep` steps.
- `load(step=None, into=None)`: the newest complete step every rank can load, from shared
  memory when valid there, else from disk (a torn step is skipped with a warning). When the
  world size changed, `into` is required and DCP reshards.
- Errors of the persister (disk full, unwritable directory) are raised by the next `save`
  or `wait`; earlier checkpoints are untouched.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from argosy.checkpoint import disk, restore
from argosy.checkpoint.config import CheckpointConfig
from argosy.checkpoint.layout import (
    ObjectEntry,
    SnapshotMeta,
    data_len,
    encode_object,
    flatten,
    plan,
)
from argosy.checkpoint.persister import PersisterSpec
from argosy.checkpoint.segment import SHM_DIR, job_segments
from argosy.checkpoint.staging import DeviceStager, share_sources
from argosy.core.errors import ArgosyError


class CheckpointError(ArgosyError):
    """The persister failed (disk full, unwritable directory, died); earlier steps are intact."""


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


class FlashCheckpointer:
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
    ) -> None:
        if keep < 1 or slots < 1:
            raise ArgosyError(f"keep and slots must be at least 1 (got keep={keep}, slots={slots})")
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.rank, self.world_size = _rank_world()
        self.job = job_id or default_job(self.directory)
        self.inline_bytes = inline_bytes
        self.start_timeout_s = start_timeout_s
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
        )
        self._proc: Any = None
        self._sockdir = ""
        self._conn: Any = None
        self._ready = False
        self._pending: int | None = None
        self._saved: int | None = None
        self._durable = -1
        self._errors: list[str] = []
        self._signature: Any = None
        self._sources: list[Any] = []
        self._stager: DeviceStager | None = None
        self._staged: tuple[int, bytes, dict[int, bytes]] | None = None
        self._closed = False
        self._maps = restore.MappingCache()
        self.last_copy_s: float | None = None
        """Seconds the persister took to copy the last snapshot into shared memory."""
        self.last_load_source: str | None = None
        """Where the last `load` read from: "memory", "disk" or None."""
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

    # -- persister process -------------------------------------------------------------

    def _start(self) -> None:
        """Start the persister as a plain subprocess in its own session.

        Not multiprocessing's spawn: that re-imports the training script's main module.
        The connection is a Unix socket authenticated with this process's multiprocessing
        key, which the persister adopts so it can receive shared-memory handles.
        """
        import multiprocessing
        import subprocess
        import sys
        import tempfile
        import threading
        from multiprocessing.connection import Listener

        import torch.multiprocessing  # noqa: F401  # registers the tensor-sharing reducers

        key = bytes(multiprocessing.current_process().authkey)
        self._sockdir = tempfile.mkdtemp(prefix="argosy-ckpt-")
        address = os.path.join(self._sockdir, "persister.sock")
        listener = Listener(address, family="AF_UNIX", authkey=key)
        env = dict(os.environ, ARGOSY_PERSISTER_KEY=key.hex())
        log = self._open_log()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "argosy.checkpoint.persister", address],
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,  # never the trainer's pipes: an orphan would hold them open
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()

        def accept() -> None:
            try:
                conn = listener.accept()
                conn.send(self._spec)
                self._conn = conn
            except OSError:
                pass
            finally:
                listener.close()

        self._acceptor = threading.Thread(target=accept, daemon=True)
        self._acceptor.start()

    def _open_log(self) -> Any:
        """The persister's stderr: `<directory>/.logs/persister-r<rank>.log`, if writable."""
        import subprocess

        try:
            logs = self.directory / ".logs"
            logs.mkdir(parents=True, exist_ok=True)
            return open(logs / f"persister-r{self.rank}.log", "ab")  # noqa: SIM115
        except OSError:
            return subprocess.DEVNULL

    def _connected(self) -> bool:
        if self._conn is not None:
            return True
        self._acceptor.join(timeout=0.05)
        if self._conn is None and self._proc.poll() is not None:
            raise CheckpointError(
                f"the checkpoint persister exited with code {self._proc.returncode}"
            )
        return self._conn is not None

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            self._ready = True
        elif kind == "copied":
            self.last_copy_s = msg[2]
            if self._pending == msg[1]:
                self._pending = None
        elif kind == "durable":
            self._durable = max(self._durable, msg[1])
        elif kind == "error":
            self._errors.append(msg[1])
        elif kind == "closed":
            self._closed = True

    def _pump(self, until: Any, timeout_s: float | None = None) -> None:
        """Handle persister messages until `until()` holds; raise if the persister died."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not until():
            if not self._connected():
                if deadline is not None and time.monotonic() > deadline:
                    raise CheckpointError(
                        f"the checkpoint persister did not start in {timeout_s} s"
                    )
                continue
            if self._conn.poll(0.05):
                try:
                    self._handle(self._conn.recv())
                except EOFError as err:
                    raise CheckpointError("the checkpoint persister exited unexpectedly") from err
                continue
            if self._proc.poll() is not None and not self._conn.poll():
                raise CheckpointError(
                    f"the checkpoint persister exited with code {self._proc.returncode}"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise CheckpointError(f"the checkpoint persister did not answer in {timeout_s} s")

    def _drain(self) -> None:
        while self._conn is not None and self._conn.poll():
            self._handle(self._conn.recv())

    def _raise_errors(self) -> None:
        self._drain()
        if self._errors:
            errors, self._errors = self._errors, []
            raise CheckpointError("; ".join(errors))

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
        entries, tensors, object_keys = plan(flat)
        meta = SnapshotMeta(
            step,
            self.rank,
            self.world_size,
            mappings,
            entries,
            [ObjectEntry(k, encode_object(flat[k])) for k in object_keys],
            data_len(entries),
        )
        on_device = any(t.device.type != "cpu" for t in tensors)
        if on_device:
            self._stager = self._stager or DeviceStager()
            sources, inline = self._stager.stage(tensors, self.inline_bytes)
        else:
            sources, inline = share_sources(tensors, self.inline_bytes)
        # Storage addresses identify the sources: `self._sources` keeps them alive, so an
        # address cannot be reused by another tensor while the persister holds it.
        signature = [
            None if s is None else (s.data_ptr(), s.dtype, tuple(s.shape), tuple(s.stride()))
            for s in sources
        ]
        self._pump(lambda: self._ready, self.start_timeout_s)
        if signature != self._signature:
            self._conn.send(("sources", sources))
            self._signature, self._sources = signature, sources
        self._saved = step
        if on_device:  # sent by the fence, once the device-to-host copy is done
            self._staged = (step, pickle.dumps(meta), inline)
            return
        self._conn.send(("snap", step, pickle.dumps(meta), inline))
        self._pending = step

    def before_optimizer_step(self) -> None:
        """Fence: returns once the last snapshot no longer reads the live tensors."""
        if self._staged is not None:
            assert self._stager is not None
            self._stager.synchronize()
            step, meta_bytes, inline = self._staged
            self._staged = None
            self._conn.send(("snap", step, meta_bytes, inline))
            self._pending = step
            return
        self._wait_copied()

    def _wait_copied(self) -> None:
        if self._pending is not None:
            self._pump(lambda: self._pending is None)

    def wait(self) -> int | None:
        """Block until the last saved step is durable on disk; returns that step."""
        self.before_optimizer_step()
        self._wait_copied()
        if self._saved is not None:
            self._conn.send(("flush",))
            self._pump(lambda: self._durable >= self._saved or bool(self._errors))
        self._raise_errors()
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
        return self._saved

    def latest_step(self) -> int | None:
        """The newest step this rank could load (memory or disk), without loading it."""
        steps = [s.step for s in restore.memory_slots(self.job, self.rank)]
        steps += disk.committed_steps(self.directory)
        return max(steps, default=None)

    # -- restore ------------------------------------------------------------------------

    def load(
        self, step: int | None = None, into: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The newest complete step (or `step`) as (step, state), or None when there is none."""
        self.before_optimizer_step()
        self._wait_copied()
        slots = restore.memory_slots(self.job, self.rank)
        on_disk = disk.committed_steps(self.directory)
        memory_sets, disk_sets = self._gather({s.step for s in slots}, set(on_disk))
        while True:
            choice = restore.choose_step(memory_sets, disk_sets, step)
            if choice is None:
                return None
            chosen, from_memory = choice
            if from_memory:
                slot = next(s for s in slots if s.step == chosen)
                result = restore.read_memory(slot, into, self._maps)
                if result is not None:
                    self.last_load_source = "memory"
                    return result
                warnings.warn(
                    f"snapshot of step {chosen} changed in memory; reading disk", stacklevel=2
                )
                memory_sets = [m - {chosen} for m in memory_sets]
                continue
            try:
                result = self._load_disk(chosen, into)
                self.last_load_source = "disk"
                return result
            except disk.TornCheckpointError as err:
                warnings.warn(f"skipping torn checkpoint step {chosen}: {err}", stacklevel=2)
                disk_sets = [d - {chosen} for d in disk_sets]
                memory_sets = [m - {chosen} for m in memory_sets]

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

    def _gather(self, memory: set[int], on_disk: set[int]) -> tuple[list[set[int]], list[set[int]]]:
        if self.world_size > 1 and torch.distributed.is_initialized():
            gathered: list[Any] = [None] * self.world_size
            torch.distributed.all_gather_object(gathered, (memory, on_disk))
            return [g[0] for g in gathered], [g[1] for g in gathered]
        return [memory], [on_disk]

    # -- ending -------------------------------------------------------------------------

    def close(self, timeout_s: float = 600.0) -> None:
        """Wait for the last snapshot to be durable, stop the persister, free shared memory."""
        atexit.unregister(self.close)
        self._maps.close()
        if self._proc is None:
            self._closed = True
            return
        try:
            self.before_optimizer_step()
            self._wait_copied()
            if self._proc.poll() is None and self._connected():
                self._conn.send(("close", True))
                self._pump(lambda: self._closed, timeout_s)
        finally:
            self._closed = True
            try:
                self._proc.wait(timeout=10)
            except Exception:  # subprocess.TimeoutExpired: it would not stop; end it
                self._proc.kill()
                self._proc.wait()
            if self._conn is not None:
                self._conn.close()
            self._proc = None
            shutil.rmtree(self._sockdir, ignore_errors=True)
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


def reclaim(job: str) -> list[Path]:
    """Remove every shared-memory segment of `job` (for tools; live owners must be gone)."""
    removed = []
    for path in job_segments(job):
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
