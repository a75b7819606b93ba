"""One file written at disk speed: laid out first, then written by parallel threads.

    plan = FilePlan()
    plan.write(b"header")                       # small pieces are kept as bytes
    plan.write(memoryview_of_a_slot)            # large ones by reference: never copied
    crc = write_parallel(path, plan, writers=4, chunk_bytes=16 << 20)

Contract:
- `FilePlan` is a write-only file object (what `torch.save` writes into): it records every
  piece at its file offset; pieces of at least `BY_REFERENCE_BYTES` are kept as views of
  the caller's buffer (which must stay unchanged until `write_parallel` returns), smaller
  ones are copied.
- `write_parallel` splits the file into `writers` contiguous ranges, each a whole number of
  `chunk_bytes` chunks aligned to file offsets; every thread writes its range with one
  `os.pwritev` per chunk (no copy of the pieces) and a running crc32 over it. The ranges'
  crcs are combined (`crc32_combine`), so the result is the crc32 of the whole file, as
  `zlib.crc32` of its bytes would give (crc.py). The file is fsynced once, after every thread is
  done. `on_write(bytes_so_far)` runs after each chunk, in the writing thread, and may
  raise to abandon the write: every other thread stops at its next chunk and the error
  is raised to the caller (the file is then garbage: the caller never publishes it).
  Disk errors (ENOSPC, EIO) are raised the same way.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from argosy.checkpoint.crc import crc32, crc32_combine

BY_REFERENCE_BYTES = 1 << 16
DEFAULT_CHUNK_BYTES = 16 << 20
_IOV_MAX = 1024


def default_writers() -> int:
    """Parallel writers: enough to keep a fast disk busy, never more than the cores."""
    return max(1, min(4, os.cpu_count() or 1))


# -- the layout -------------------------------------------------------------------------


class FilePlan:
    """A write-only file object that records pieces at offsets instead of writing them."""

    def __init__(self) -> None:
        self.pieces: list[tuple[int, Any]] = []
        """(file offset, bytes or a byte memoryview), in file order, back to back."""
        self.writes: list[tuple[int, int]] = []
        """(offset, length) of every `write` call: where the caller's buffers landed."""
        self.pos = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.writes.append((self.pos, view.nbytes))
        if view.nbytes:
            piece = view if view.nbytes >= BY_REFERENCE_BYTES else bytes(view)
            self.pieces.append((self.pos, piece))
        self.pos += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def buffers(self, start: int, end: int) -> list[Any]:
        """The byte views that cover [start, end) of the file, in order."""
        out = []
        lo, hi = 0, len(self.pieces)
        while lo < hi:  # the last piece starting at or before `start`
            mid = (lo + hi) // 2
            if self.pieces[mid][0] <= start:
                lo = mid + 1
            else:
                hi = mid
        for offset, piece in self.pieces[max(0, lo - 1) :]:
            if offset >= end:
                break
            view = memoryview(piece)
            a, b = max(start, offset) - offset, min(end, offset + view.nbytes) - offset
            if b > a:
                out.append(view[a:b])
        return out


# -- the parallel write -----------------------------------------------------------------


class _Shared:
    def __init__(self, on_write: Callable[[int], None] | None) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.error: BaseException | None = None
        self.on_write = on_write

    def advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            done = self.done
        if self.on_write is not None:
            self.on_write(done)


def _write_range(fd: int, plan: FilePlan, start: int, end: int, chunk: int, shared: _Shared) -> int:
    crc = 0
    for at in range(start, end, chunk):
        if shared.error is not None:
            return crc
        stop = min(end, at + chunk)
        bufs = plan.buffers(at, stop)
        for buf in bufs:
            crc = crc32(buf, crc)
        _pwritev_all(fd, bufs, at)
        shared.advance(stop - at)
    return crc


def _pwritev_all(fd: int, bufs: list[Any], offset: int) -> None:
    """Write every buffer at `offset`, going on after short writes."""
    while bufs:
        batch = bufs[:_IOV_MAX]
        written = os.pwritev(fd, batch, offset)
        if written <= 0:
            raise OSError(f"pwritev wrote {written} bytes at offset {offset}")
        offset += written
        while written and bufs:
            n = bufs[0].nbytes
            if written >= n:
                written -= n
                bufs = bufs[1:]
            else:
                bufs = [bufs[0][written:], *bufs[1:]]
                written = 0


def split(size: int, writers: int, chunk: int) -> list[tuple[int, int]]:
    """`writers` contiguous ranges covering [0, size), each a whole number of chunks."""
    chunks = max(1, -(-size // chunk))
    per = -(-chunks // max(1, writers))
    ranges = []
    for first in range(0, chunks, per):
        ranges.append((first * chunk, min(size, (first + per) * chunk)))
    return ranges


def write_parallel(
    path: Path,
    plan: FilePlan,
    writers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    on_write: Callable[[int], None] | None = None,
) -> int:
    """Write `plan` to `path` (created or truncated), fsynced; returns its crc32."""
    writers = writers or default_writers()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        ranges = split(plan.pos, writers, chunk_bytes) if plan.pos else []
        shared = _Shared(on_write)
        crcs = [0] * len(ranges)

        def body(index: int) -> None:
            try:
                crcs[index] = _write_range(fd, plan, *ranges[index], chunk_bytes, shared)
            except BaseException as err:  # the fence, a disk error: stop every thread
                shared.error = shared.error or err

        threads = [threading.Thread(target=body, args=(i,)) for i in range(1, len(ranges))]
        for thread in threads:
            thread.start()
        if ranges:
            body(0)  # the calling thread writes the first range
        for thread in threads:
            thread.join()
        if shared.error is not None:
            raise shared.error
        os.fsync(fd)
    finally:
        os.close(fd)
    crc = 0
    for (start, end), part in zip(ranges, crcs, strict=True):
        crc = crc32_combine(crc, part, end - start)
    return crc
