"""The progress board: one small shared-memory array per run, written by ranks, read by the agent.

Each rank owns one row of float64 slots (see `Slot`) and a ring of recent steps
(step, loss, end time, compute seconds). Ranks only write their own row; the agent only
reads. Nothing blocks: a rank stuck in a collective simply stops writing, and the agent,
reading at its own pace, sees the stall. Times are `time.monotonic()` seconds, which is
system-wide on Linux, so rows of different processes on one host compare directly.

board = ProgressBoard.create(path, world_size=2)   # agent
row = ProgressBoard.attach(path).row(rank)          # rank
row.set(Slot.STEP, 7)
board.snapshot()                                    # agent: a copy, never a view
"""

from __future__ import annotations

import os
from enum import IntEnum
from pathlib import Path

import numpy as np

from argosy.core.own_files import open_own, shared_memory_dir
from argosy.core.procs import pid_alive

RING = 512
"""Steps kept per rank; the agent reads at ~10 Hz, so this covers 5,000 steps/s."""
RING_FIELDS = 4  # step, loss, t_end, compute_s
MAX_INJECTIONS = 16
"""Fault injections a run may carry; each has one 'fired at' slot per rank."""


class Slot(IntEnum):
    """Per-rank scalar slots; 0 means 'not yet' for times."""

    PID = 0
    ATTEMPT = 1
    T_ATTACH = 2
    T_RESTORED = 3
    RESTORED_STEP = 4
    STEP = 5
    T_STEP = 6
    HEARTBEAT = 7
    COLL_ENTERED = 8
    COLL_EXITED = 9
    T_COLL_ENTER = 10
    STEP_COUNT = 11
    T_STEP_BEGIN = 12
    T_DONE = 13
    CKPT_STEP = 14
    T_CKPT = 15
    CKPT_COUNT = 16
    CKPT_BUSY = 17
    CKPT_PROGRESS = 18
    """Bytes of checkpoint work done so far (copied, written, seen from other ranks)."""
    T_CKPT_PROGRESS = 19
    CKPT_PHASE = 20
    TARGET_STEP = 21
    """The step the script trains to (0: not said)."""
    CKPT_COMMITTED = 22
    """The newest step this rank knows committed on disk (set after `wait`)."""
    CUDA_DEVICE = 23
    """The CUDA device index the rank's process works on, plus one (0: none seen); set
    when it says it restored, so the standby that may replace it warms that device."""


SCALARS = 24
INJ_BASE = SCALARS
RING_BASE = INJ_BASE + MAX_INJECTIONS
ROW = RING_BASE + RING * RING_FIELDS


BOARD_GLOB = "argosy-*.board"


def default_board_path(run_id: str, owner_pid: int | None = None) -> Path:
    """Where a run's board lives: /dev/shm when it exists, else the temp directory.

    The name ends with the owning launcher's pid (`argosy-<run id>.<pid>.board`), so the
    next launch can tell a leaked board (its owner is dead) from a live one.
    """
    return shared_memory_dir() / f"argosy-{run_id}.{owner_pid or os.getpid()}.board"


def owner_of(path: Path) -> int | None:
    """The launcher pid a board's name carries (None for a name without one)."""
    stem = path.name.removesuffix(".board")
    _, _, pid = stem.rpartition(".")
    return int(pid) if pid.isdigit() else None


def live_runs(directory: Path) -> set[str]:
    """The run ids of the boards in `directory` whose launcher still runs (this one's too)."""
    live = set()
    for path in directory.glob(BOARD_GLOB):
        pid = owner_of(path)
        if pid is not None and (pid == os.getpid() or pid_alive(pid)):
            live.add(path.name.removeprefix("argosy-").rsplit(".", 2)[0])
    return live


def reap_stale_boards(directory: Path) -> list[Path]:
    """Unlink the boards in `directory` whose owning launcher is dead; the ones removed.

    A launcher killed with SIGKILL cannot remove its board; the next one does. Boards
    whose name carries no pid are left alone: nobody can tell whether they are in use.
    So are other users' boards (a job user's launcher shares /dev/shm with other
    tenants' and root's: theirs are theirs to reap, and the sticky bit forbids it).
    """
    removed = []
    me = os.geteuid()
    for path in directory.glob(BOARD_GLOB):
        pid = owner_of(path)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            if path.lstat().st_uid != me:
                continue
            path.unlink()
        except OSError:
            continue  # gone meanwhile, or not ours to remove
        removed.append(path)
    return removed


class BoardRow:
    """One rank's row: the only part of the board a rank writes."""

    def __init__(self, data: np.ndarray) -> None:
        self._data = data

    def set(self, slot: Slot, value: float) -> None:
        self._data[slot] = value

    def get(self, slot: Slot) -> float:
        return float(self._data[slot])

    def add(self, slot: Slot, delta: float = 1.0) -> float:
        self._data[slot] += delta
        return float(self._data[slot])

    def fired(self, injection: int, at_s: float) -> None:
        self._data[INJ_BASE + injection] = at_s

    def push_step(self, step: int, loss: float, t_end: float, compute_s: float) -> None:
        """Append one finished step to the ring, then publish it by bumping the count."""
        count = int(self._data[Slot.STEP_COUNT])
        base = RING_BASE + (count % RING) * RING_FIELDS
        self._data[base : base + RING_FIELDS] = (step, loss, t_end, compute_s)
        self._data[Slot.STEP] = step
        self._data[Slot.T_STEP] = t_end
        self._data[Slot.HEARTBEAT] = t_end
        self._data[Slot.STEP_COUNT] = count + 1


class ProgressBoard:
    """A memory-mapped (world_size, ROW) float64 array in a file on tmpfs."""

    def __init__(self, path: Path, data: np.memmap) -> None:
        self.path = path
        self._data = data

    @property
    def world_size(self) -> int:
        return int(self._data.shape[0])

    @classmethod
    def create(cls, path: Path, world_size: int) -> ProgressBoard:
        """Create (or wipe) the board for `world_size` ranks."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_own(path, os.O_RDWR | os.O_CREAT)  # /dev/shm is every user's
        with os.fdopen(fd, "r+b") as handle:
            handle.truncate(world_size * ROW * 8)
            data = np.memmap(handle, dtype=np.float64, mode="r+", shape=(world_size, ROW))
        data[:] = 0.0
        return cls(path, data)

    @classmethod
    def attach(cls, path: Path) -> ProgressBoard:
        """Open an existing board for writing one's own row."""
        with os.fdopen(open_own(path, os.O_RDWR), "r+b") as handle:
            size = os.fstat(handle.fileno()).st_size // 8
            assert size % ROW == 0, f"{path} is not a progress board"
            data = np.memmap(handle, dtype=np.float64, mode="r+", shape=(size // ROW, ROW))
        return cls(path, data)

    def row(self, rank: int) -> BoardRow:
        return BoardRow(self._data[rank])

    def reset(self) -> None:
        """Zero every row before a new attempt starts its ranks."""
        self._data[:] = 0.0

    def snapshot(self) -> np.ndarray:
        """A private copy of the whole board, consistent enough for monitoring."""
        return np.array(self._data, copy=True)

    def close(self) -> None:
        mm = getattr(self._data, "_mmap", None)
        if mm is not None:
            self._data.flush()
        del self._data

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)


def scalar(snapshot: np.ndarray, rank: int, slot: Slot) -> float:
    return float(snapshot[rank, slot])


def injected_at(snapshot: np.ndarray, rank: int, injection: int) -> float:
    return float(snapshot[rank, INJ_BASE + injection])


def ring_entries(snapshot: np.ndarray, rank: int, since: int) -> tuple[list[tuple], int]:
    """Steps the rank pushed after count `since` (at most RING), and the new count."""
    count = int(snapshot[rank, Slot.STEP_COUNT])
    first = max(since, count - RING)
    out = []
    for i in range(first, count):
        base = RING_BASE + (i % RING) * RING_FIELDS
        step, loss, t_end, compute_s = snapshot[rank, base : base + RING_FIELDS]
        out.append((int(step), float(loss), float(t_end), float(compute_s)))
    return out, count
