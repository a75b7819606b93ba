"""One snapshot slot in POSIX shared memory (a file under /dev/shm).

Layout: a 4 KiB header, then the tensor bytes (`data_len`), then the pickled metadata
(`meta_len`). The header says whether the slot holds a complete snapshot:

    magic "ARGOSYCK" | version | state | step | data_len | meta_len | meta_crc | owner_pid

`state` is EMPTY, WRITING or COMPLETE. The writer sets WRITING before it touches the
bytes and COMPLETE (with the metadata checksum) only after every byte is in place, so a
process killed mid-copy leaves a slot that is never read as good. Segments are named by
job, rank and slot, so a process restarted on the same host finds them; whoever owns a
segment holds an exclusive `flock` on it, readers a shared one.

Where: this user's own folder, `<base>/argosy-<uid>` (base: `$ARGOSY_SHM_DIR`, else
/dev/shm, else the temp folder), made with mode 0700. Job ids are public, and in a shared
/dev/shm another user could create a job's slot names first, so that every save and
restart of that job would fail on a file it does not own; nobody else can create names in
a folder of ours. Should another user hold the folder's name, a fresh private folder is
used instead (with a warning): snapshots still work, though a restarted process, which
looks in the usual folder, then restores from disk. A launcher frees its run's slots when
it ends; the slots of a launcher killed before it could (SIGKILL, its node lost) are
freed by the same user's next launch on the machine (`stale_run_segments`).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from argosy.core.own_files import open_own, private_directory, shared_memory_dir


def private_dir(base: Path) -> Path:
    """`base/argosy-<uid>`, a folder only this user can use (made, or checked: ours,
    not a link, mode 0700); a fresh private folder under `base` if another user holds
    that name."""
    what = "flash-checkpoint slots (a restarted process will restore from disk)"
    return private_directory(base / f"argosy-{os.geteuid()}", what)


def _shm_base() -> Path:
    chosen = os.environ.get("ARGOSY_SHM_DIR")
    return Path(chosen) if chosen else shared_memory_dir()


SHM_DIR = private_dir(_shm_base())
"""Where this user's slots live (see the module docstring)."""
PREFIX = "argosy-ckpt-"
HEADER_BYTES = 4096
MAGIC = b"ARGOSYCK"
VERSION = 1
_HEADER = struct.Struct("<8sIIqQQIq")
_TOUCH_CHUNK = 64 << 20


class SlotState(IntEnum):
    EMPTY = 0
    WRITING = 1
    COMPLETE = 2


@dataclass(frozen=True)
class Header:
    """What a slot's first bytes say about it."""

    state: SlotState
    step: int
    data_len: int
    meta_len: int
    meta_crc: int
    owner_pid: int


def segment_name(job: str, rank: int, slot: int) -> str:
    return f"{PREFIX}{job}-r{rank}-s{slot}"


HELD_SLOTS = 2


def held_name(job: str, rank: int, index: int) -> str:
    """Slots a trainer fills itself while its persister starts (adopted by it later);
    two, so the newest complete one survives a copy cut short."""
    return f"{PREFIX}{job}-r{rank}-sh{index}"


def segment_paths(job: str, rank: int) -> list[Path]:
    """Every slot segment of (job, rank) present on this host, by slot number."""
    return sorted(SHM_DIR.glob(f"{PREFIX}{job}-r{rank}-s*"))


def job_segments(job: str) -> list[Path]:
    return sorted(SHM_DIR.glob(f"{PREFIX}{job}-r*"))


LAUNCHER_RUN = re.compile(r"\d{6}-\d{6}")
"""The shape of an `argosy launch` run id (`HHMMSS-<hash of the run dir>`)."""


def stale_run_segments(live_runs: set[str]) -> list[Path]:
    """This user's slots of launcher runs that are over (no live board: their launcher
    was killed, SIGKILL or its node lost, before it could free them): tmpfs is memory, and
    nothing else would ever free them. Slots of other names (a script's own
    checkpointer, not under a launcher) are left alone."""
    stale = []
    for path in SHM_DIR.glob(f"{PREFIX}*-r*"):
        run = path.name.removeprefix(PREFIX).rsplit("-r", 1)[0]
        if LAUNCHER_RUN.fullmatch(run) and run not in live_runs:
            stale.append(path)
    return sorted(stale)


class Segment:
    """A mapped slot file. `data` and `meta` regions are memoryviews into the mapping."""

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size) if size else None

    @classmethod
    def create(
        cls, path: Path, size: int, on_touch: Callable[[int], None] | None = None
    ) -> Segment:
        """Create (or grow) the file, map it and touch every page so later copies never fault;
        `on_touch(bytes)` runs after every chunk touched (progress)."""
        fd = open_own(path, os.O_RDWR | os.O_CREAT)
        try:
            os.ftruncate(fd, size)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        seg = cls(path, fd, size)
        seg.prefault(on_touch)
        return seg

    @classmethod
    def open(cls, path: Path, writable: bool = False, populate: bool = False) -> Segment:
        fd = open_own(path, os.O_RDWR if writable else os.O_RDONLY)
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES:
            os.close(fd)
            raise ValueError(f"{path}: {size} bytes, smaller than a header")
        seg = cls.__new__(cls)
        seg.path, seg.fd, seg.size = path, fd, size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        # MAP_POPULATE maps every page in one call: faulting them one by one costs more
        # than the copy that follows (a restore reads the whole slot anyway)
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        seg.map = mmap.mmap(fd, size, flags=flags, prot=prot)
        return seg

    def prefault(self, on_touch: Callable[[int], None] | None = None) -> None:
        """Write one byte per page: tmpfs allocates on first touch, which is 5-10x a copy."""
        view = memoryview(self.map)
        zero = bytes(_TOUCH_CHUNK)
        for start in range(0, self.size, _TOUCH_CHUNK):
            end = min(self.size, start + _TOUCH_CHUNK)
            view[start:end] = zero[: end - start]
            if on_touch is not None:
                on_touch(end - start)
        view.release()

    def lock(self, exclusive: bool, blocking: bool = True) -> bool:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(self.fd, flags)
        except BlockingIOError:
            return False
        return True

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    # -- header -------------------------------------------------------------------------

    def header(self) -> Header | None:
        """The parsed header, or None when the bytes are not an argosy slot."""
        magic, version, state, step, data_len, meta_len, crc, owner = _HEADER.unpack_from(
            self.map, 0
        )
        if magic != MAGIC or version != VERSION or state not in SlotState._value2member_map_:
            return None
        return Header(SlotState(state), step, data_len, meta_len, crc, owner)

    def write_header(self, header: Header) -> None:
        _HEADER.pack_into(
            self.map,
            0,
            MAGIC,
            VERSION,
            int(header.state),
            header.step,
            header.data_len,
            header.meta_len,
            header.meta_crc,
            header.owner_pid,
        )

    def set_owner(self, pid: int) -> None:
        head = self.header()
        if head is not None:
            self.write_header(
                Header(head.state, head.step, head.data_len, head.meta_len, head.meta_crc, pid)
            )

    # -- regions ------------------------------------------------------------------------

    def capacity(self) -> int:
        return self.size - HEADER_BYTES

    def data_view(self, length: int) -> memoryview:
        return memoryview(self.map)[HEADER_BYTES : HEADER_BYTES + length]

    def write_meta(self, data_len: int, meta: bytes) -> int:
        start = HEADER_BYTES + data_len
        self.map[start : start + len(meta)] = meta
        return zlib.crc32(meta)

    def read_meta(self, head: Header) -> bytes | None:
        """The metadata bytes when the slot is complete and they match their checksum."""
        if head.state is not SlotState.COMPLETE:
            return None
        start = HEADER_BYTES + head.data_len
        if start + head.meta_len > self.size:
            return None
        meta = bytes(self.map[start : start + head.meta_len])
        return meta if zlib.crc32(meta) == head.meta_crc else None

    def close(self) -> None:
        if self.map is not None:
            # BufferError: a view is still exported; the mapping then dies with the process
            with contextlib.suppress(BufferError):
                self.map.close()
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)
