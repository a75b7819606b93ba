"""One file written at disk speed: laid out first, then written by parallel threads.

    plan = FilePlan(source=slot_view)           # pieces inside the slot: by reference
    plan.write(b"header")                       # small pieces elsewhere are kept as bytes
    plan.write(slot_view[a:b])                  # slot bytes (and large pieces): never copied
    crc = write_parallel(path, plan, writers=4, chunk_bytes=16 << 20, ready=copy.wait_for)

Contract:
- `FilePlan` is a write-only file object (what `torch.save` writes into): it records every
  piece at its file offset. Pieces that lie inside `source` (the snapshot's slot) and
  pieces of at least `BY_REFERENCE_BYTES` are kept as views of the caller's buffer (which
  must hold its final bytes by the time they are written, and keep them until
  `write_parallel` returns); smaller ones are copied. For the pieces of `source` it also
  records which of its bytes each file range needs (`source_needed`).
- `write_parallel` cuts the file into `chunk_bytes` chunks aligned to file offsets and
  hands them out in file order to `writers` threads; a thread first waits, through
  `ready(n)`, until the first `n` bytes of `source` its chunk needs are in place (the
  snapshot may still be landing in its slot: the write runs behind the copy), then writes
  the chunk with one `os.pwritev` (no copy of the pieces) and checksums it. The chunks'
  crcs are combined (`crc32_combine`) in file order, so the result is the crc32 of the
  whole file, as `zlib.crc32` of its bytes would give (crc.py). The file is fsynced once,
  after every thread is done, unless the caller syncs it. `on_write(bytes_so_far)` runs
  after each chunk, in the writing thread, and may raise to abandon the write: every
  other thread stops at its next chunk and the error is raised to the caller (the file is
  then garbage: the caller never publishes it). Disk errors (ENOSPC, EIO) and errors of
  `ready` (a copy that failed) are raised the same way.
"""

from __future__ import annotations

import bisect
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


def address(view: memoryview) -> int:
    """Where a byte view's memory starts (views of one buffer compare by it)."""
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0


# -- the layout -------------------------------------------------------------------------


class FilePlan:
    """A write-only file object that records pieces at offsets instead of writing them."""

    def __init__(self, source: memoryview | None = None) -> None:
        self.pieces: list[tuple[int, Any]] = []
        """(file offset, bytes or a byte memoryview), in file order, back to back."""
        self.writes: list[tuple[int, int]] = []
        """(offset, length) of every `write` call: where the caller's buffers landed."""
        self.pos = 0
        self._source = (address(source), source.nbytes) if source is not None else (0, 0)
        self._from_source: list[tuple[int, int, int]] = []
        """(file offset, source offset, length) of every piece of `source`, in file order."""
        self._needed_before: list[int] = [0]
        """Source bytes needed by every earlier piece of `source` (a running maximum)."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.writes.append((self.pos, view.nbytes))
        if view.nbytes:
            at = self._source_offset(view)
            if at is not None:
                self._from_source.append((self.pos, at, view.nbytes))
                self._needed_before.append(max(self._needed_before[-1], at + view.nbytes))
            by_reference = at is not None or view.nbytes >= BY_REFERENCE_BYTES
            self.pieces.append((self.pos, view if by_reference else bytes(view)))
        self.pos += view.nbytes
        return view.nbytes

    def _source_offset(self, view: memoryview) -> int | None:
        base, size = self._source
        if not size:
            return None
        at = address(view) - base
        return at if at >= 0 and at + view.nbytes <= size else None

    def source_needed(self, end: int) -> int:
        """How many leading bytes of `source` must be in place to write [0, end)."""
        index = bisect.bisect_left(self._from_source, (end,)) - 1
        if index < 0:
            return 0
        offset, at, length = self._from_source[index]
        return max(self._needed_before[index], at + min(length, end - offset))

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
    """What the writing threads share: the next chunk, bytes done, the first error."""

    def __init__(self, chunks: int, on_write: Callable[[int], None] | None) -> None:
        self.lock = threading.Lock()
        self.next_chunk = 0
        self.chunks = chunks
        self.done = 0
        self.error: BaseException | None = None
        self.on_write = on_write

    def take(self) -> int | None:
        """The next chunk to write, in file order; None when all are taken or one failed."""
        with self.lock:
            if self.error is not None or self.next_chunk >= self.chunks:
                return None
            self.next_chunk += 1
            return self.next_chunk - 1

    def advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            done = self.done
        if self.on_write is not None:
            self.on_write(done)


def _write_chunks(
    fd: int,
    plan: FilePlan,
    chunk: int,
    shared: _Shared,
    crcs: list[int],
    ready: Callable[[int], None] | None,
) -> None:
    while (index := shared.take()) is not None:
        start = index * chunk
        stop = min(plan.pos, start + chunk)
        if ready is not None:
            ready(plan.source_needed(stop))
        crc = 0
        bufs = plan.buffers(start, stop)
        for buf in bufs:
            crc = crc32(buf, crc)
        _pwritev_all(fd, bufs, start)
        crcs[index] = crc
        shared.advance(stop - start)


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


def write_parallel(
    path: Path,
    plan: FilePlan,
    writers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    on_write: Callable[[int], None] | None = None,
    fsync: bool = True,
    ready: Callable[[int], None] | None = None,
) -> int:
    """Write `plan` to `path` (created or truncated), fsynced unless the caller syncs it
    (`fsync=False`), each chunk once `ready` says its bytes of the source are in place;
    returns the file's crc32."""
    chunks = -(-plan.pos // chunk_bytes)
    writers = max(1, min(writers or default_writers(), chunks))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        shared = _Shared(chunks, on_write)
        crcs = [0] * chunks

        def body() -> None:
            try:
                _write_chunks(fd, plan, chunk_bytes, shared, crcs, ready)
            except BaseException as err:  # the fence, a disk error, a failed copy: stop all
                with shared.lock:
                    shared.error = shared.error or err

        threads = [threading.Thread(target=body) for _ in range(1, writers)]
        for thread in threads:
            thread.start()
        body()  # the calling thread is one of the writers
        for thread in threads:
            thread.join()
        if shared.error is not None:
            raise shared.error
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    crc = 0
    for index, part in enumerate(crcs):
        crc = crc32_combine(crc, part, min(chunk_bytes, plan.pos - index * chunk_bytes))
    return crc
