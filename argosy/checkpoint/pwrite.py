"""One file written at disk speed: laid out first, then written by parallel threads.

    plan = FilePlan(source=slot_view)           # pieces inside the slot: by reference
    plan.write(b"header")                       # small pieces elsewhere are kept as bytes
    plan.write(slot_view[a:b])                  # slot bytes (and large pieces): never copied
    crc = write_parallel(path, plan, writers=4, chunk_bytes=16 << 20, ready=landing.wait_for)

Contract:
- The file comes as a `fileplan.FilePlan`: every piece at its file offset, pieces of the
  caller's buffers by reference (which must hold their final bytes by the time they are
  written, and keep them until `write_parallel` returns).
- `write_parallel` cuts the file into `chunk_bytes` chunks aligned to file offsets and
  hands them out in file order to `writers` threads; a thread first waits, through
  `ready(n)`, until the first `n` bytes of `source` its chunk needs are in place (the
  snapshot may still be landing in its slot: the write runs behind the copy), then
  writes it with one `os.pwritev` (no copy of the pieces). Then the file is synced (one
  fsync, or the caller's `sync()`) on a thread while the writers checksum the same
  chunks: the crc pass runs while the disk flushes, not before it (a chunk written with
  direct I/O, which leaves the sync little to flush, is checksummed right after its
  write by a thread of its own, while its writer goes on to the next). The chunks' crcs are
  combined (`crc32_combine`) in file order, so the result is the crc32 of the whole
  file, as `zlib.crc32` of its bytes would give (crc.py). `on_write(bytes_so_far)` runs
  after each chunk, in the writing thread, and may raise to abandon the write: every
  other thread stops at its next chunk and the error is raised to the caller (the file
  is then garbage: the caller never publishes it). Disk errors (ENOSPC, EIO) and errors of
  `ready` (a copy that failed) are raised the same way.
- Direct I/O: a piece held by reference whose memory address agrees with its file offset
  modulo `DIRECT_ALIGN` (a slot's tensor bytes, laid out so by records.py) has its whole
  aligned blocks written with `O_DIRECT` as they are (no copy into the page cache, and
  nothing of them left for the sync to flush: on the VM this was built on, 1 GB in
  0.27 s against 0.44 s buffered, and without the buffered path's multi-second stalls).
  Everything else in a chunk (records' headers, small tensors, the unaligned head and
  tail of a piece) lies in runs of whole blocks between those, and is gathered into a
  page-aligned scratch buffer of the writer thread: the chunk goes out as one direct
  `pwritev` of aligned vectors (a state of a thousand 1 MiB tensors wrote at 1.5x the
  disk's floor as 16 direct writes and 16 buffered ones a chunk). Only the file's last
  partial block is written buffered. A file system without `O_DIRECT` (tmpfs), or one
  that refuses a direct write (EINVAL), gets the buffered path for the rest of the file;
  `direct=False` turns it off.
- `below` > 0 lowers the threads of a background write; `hurry()` says when someone now
  waits for it (a flush, a close). A lowered thread cannot raise itself back, so from then
  on the caller and `writers - 1` new threads at the process's own priority take the
  remaining chunks from the same file-order queue; the checksum pass and the sync start
  unlowered, and a sync already running lowered is run again unlowered beside it (the
  second fsync submits what the first has not yet and waits on the same flush).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from argosy.checkpoint.crc import crc32, crc32_combine
from argosy.checkpoint.fileplan import FilePlan, address

DIRECT_ALIGN = 4096
"""Alignment of a direct write's memory, file offset and length (the largest logical
block size in common use)."""
DIRECT_MIN_BYTES = 1 << 20
"""Smaller aligned runs are written buffered (not worth a direct write's latency)."""
DEFAULT_CHUNK_BYTES = 16 << 20
SUMMER_THREAD = "argosy-chunk-crc"
_IOV_MAX = 1024
_HURRY_POLL_S = 0.005


def default_writers() -> int:
    """Parallel writers: enough to keep a fast disk busy, never more than the cores."""
    return max(1, min(4, os.cpu_count() or 1))


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

    def untaken(self) -> bool:
        """Whether chunks are left to take (and none failed)."""
        with self.lock:
            return self.error is None and self.next_chunk < self.chunks

    def advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            done = self.done
        if self.on_write is not None:
            self.on_write(done)


class _Fds:
    """The file opened buffered, and with O_DIRECT where the file system allows it."""

    def __init__(self, path: Path, direct: bool) -> None:
        self.buffered = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.direct: int | None = None
        self.refused = False
        """A direct write was refused (EINVAL): the rest of the file goes buffered. The fd
        stays open until the writers are done (another may be writing through it)."""
        if direct and hasattr(os, "O_DIRECT"):
            with contextlib.suppress(OSError):  # tmpfs and others: EINVAL
                self.direct = os.open(path, os.O_WRONLY | os.O_DIRECT)

    @property
    def direct_usable(self) -> bool:
        return self.direct is not None and not self.refused

    def close_direct(self) -> None:
        fd, self.direct = self.direct, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.close_direct()
        os.close(self.buffered)


def direct_io_works(directory: Path) -> bool:
    """Whether files in `directory` take an aligned O_DIRECT write (tmpfs: no)."""
    import mmap

    probe = directory / ".direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except (OSError, AttributeError):
        return False
    try:
        os.pwrite(fd, mmap.mmap(-1, DIRECT_ALIGN), 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def split_direct(bufs: list[Any], offset: int) -> list[tuple[int, list[Any], bool]]:
    """`bufs`, to be written back to back at `offset`, as runs (offset, views, direct):
    direct runs are one view of whole `DIRECT_ALIGN` blocks whose address agrees with its
    file offset, at least `DIRECT_MIN_BYTES` long, sent as they are; the rest (in order)
    lies between them, gathered into whole blocks by `_write_direct`."""
    runs: list[tuple[int, list[Any], bool]] = []

    def buffered(at: int, view: Any) -> None:  # joins the buffered run ending at `at`
        if runs and not runs[-1][2]:
            runs[-1][1].append(view)
        else:
            runs.append((at, [view], False))

    for buf in bufs:
        view = memoryview(buf)
        end = offset + view.nbytes
        lo = -(-offset // DIRECT_ALIGN) * DIRECT_ALIGN
        hi = end // DIRECT_ALIGN * DIRECT_ALIGN
        if hi - lo < DIRECT_MIN_BYTES or (address(view) - offset) % DIRECT_ALIGN:
            buffered(offset, view)
        else:
            if lo > offset:
                buffered(offset, view[: lo - offset])
            runs.append((lo, [view[lo - offset : hi - offset]], True))
            if hi < end:
                buffered(hi, view[hi - offset :])
        offset = end
    return runs


def _write_chunks(
    fds: _Fds,
    plan: FilePlan,
    chunk: int,
    shared: _Shared,
    summer: _Summer,
    ready: Callable[[int], None] | None,
) -> None:
    """Write the chunks `shared` hands out, each once `ready` says the bytes of the source
    it needs are in place; a chunk written with direct I/O goes to `summer` at once (the
    sync will have little to flush, so no pass could hide behind it)."""
    bounce = _Bounce(chunk)
    while (index := shared.take()) is not None:
        start = index * chunk
        stop = min(plan.pos, start + chunk)
        if ready is not None:
            ready(plan.source_needed(stop))
        bufs = plan.buffers(start, stop)
        if fds.direct_usable and _write_direct(fds, bufs, start, stop == plan.pos, bounce):
            summer.add(index, bufs)
        else:
            _pwritev_all(fds.buffered, bufs, start)
        shared.advance(stop - start)


class _Summer:
    """Checksums chunks written with direct I/O on a thread of its own, while the writers
    go on: a writer that summed its own chunk left the disk one write short meanwhile
    (1 GB at 1.07x the disk's floor, against 1.03x so). `finish()` sums what is left on
    the caller's thread too (at its priority) and waits; `stop()` drops what is left."""

    def __init__(self, crcs: list[int | None], below: int) -> None:
        self.crcs = crcs
        self._cond = threading.Condition()
        self._todo: collections.deque[tuple[int, list[Any]]] = collections.deque()
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(below,), name=SUMMER_THREAD, daemon=True
        )
        self._thread.start()

    def add(self, index: int, bufs: list[Any]) -> None:
        """Chunk `index`, whose bytes are `bufs` (the views its writer wrote)."""
        with self._cond:
            self._todo.append((index, bufs))
            self._cond.notify()

    def finish(self) -> None:
        """Every added chunk summed (some here), the thread gone; its error raised."""
        self._close(drop=False)
        self._drain(wait=False)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._close(drop=True)
        self._thread.join()

    def _close(self, drop: bool) -> None:
        with self._cond:
            self._closed = True
            if drop:
                self._todo.clear()
            self._cond.notify_all()

    def _run(self, below: int) -> None:
        _lower(below)
        try:
            self._drain(wait=True)
        except BaseException as err:  # raised by finish()
            self.error = err

    def _drain(self, wait: bool) -> None:
        while True:
            with self._cond:
                while wait and not self._todo and not self._closed:
                    self._cond.wait()
                if not self._todo:
                    return
                index, bufs = self._todo.popleft()
            self.crcs[index] = _crc_of(bufs)


class _Bounce:
    """A writer thread's page-aligned scratch, where the small pieces between a chunk's
    direct runs (records' headers, small tensors) are gathered into whole blocks; room
    for one chunk, mapped at the first use."""

    def __init__(self, chunk: int) -> None:
        self.size = -(-chunk // DIRECT_ALIGN) * DIRECT_ALIGN
        self.used = 0
        self._map: Any = None

    def clear(self) -> None:
        """Free for the next chunk (the last chunk's vectors are written)."""
        self.used = 0

    def gather(self, views: list[Any], n: int) -> memoryview:
        """The `n` bytes of `views`, back to back at the next block boundary."""
        import mmap

        if self._map is None:
            self._map = mmap.mmap(-1, self.size)
        if self.used + n > self.size:
            raise ValueError(
                f"{n} bytes do not fit the scratch block ({self.size - self.used} left)"
            )
        out = memoryview(self._map)[self.used : self.used + n]
        at = 0
        for view in views:
            out[at : at + view.nbytes] = view
            at += view.nbytes
        self.used += -(-n // DIRECT_ALIGN) * DIRECT_ALIGN
        return out


def _write_direct(fds: _Fds, bufs: list[Any], start: int, last: bool, bounce: _Bounce) -> bool:
    """One chunk with direct I/O, as one `pwritev` of block-aligned vectors: its direct
    runs as they are, the pieces between them gathered into `bounce` (runs start and end
    on block boundaries, but for the file's last partial block, written buffered). False
    when the chunk was not written so (the file system refused: the caller writes it
    buffered; direct I/O is off for the rest of the file)."""
    vectors: list[Any] = []
    tail: tuple[int, Any] | None = None
    bounce.clear()
    for at, views, direct in split_direct(bufs, start):
        if direct:
            vectors.append(views[0])
            continue
        n = sum(v.nbytes for v in views)
        whole = n // DIRECT_ALIGN * DIRECT_ALIGN
        if at % DIRECT_ALIGN or (whole != n and not last):
            return False  # a chunk not block-aligned (`chunk_bytes` not a whole block)
        gathered = bounce.gather(views, n)
        if whole:
            vectors.append(gathered[:whole])
        if whole != n:
            tail = (at + whole, gathered[whole:])
    assert fds.direct is not None
    try:
        _pwritev_all(fds.direct, vectors, start)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        fds.refused = True
        return False
    if tail is not None:
        _pwritev_all(fds.buffered, [tail[1]], tail[0])
    return True


def _crc_of(bufs: list[Any]) -> int:
    crc = 0
    for buf in bufs:
        crc = crc32(buf, crc)
    return crc


def _checksum_chunks(plan: FilePlan, chunk: int, shared: _Shared, crcs: list[int | None]) -> None:
    """Checksum the chunks `shared` hands out that their writer did not."""
    while (index := shared.take()) is not None:
        if crcs[index] is None:
            start = index * chunk
            crcs[index] = _crc_of(plan.buffers(start, min(plan.pos, start + chunk)))


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


def _lower(below: int) -> None:
    """This thread `below` nice levels under its process (at most 19): lowering needs no
    privilege, raising it back would, so only threads made for one write are lowered."""
    if below > 0:
        with contextlib.suppress(OSError):
            now = os.getpriority(os.PRIO_PROCESS, 0)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, now + below))


def _in_threads(
    threads: int,
    work: Callable[[], None],
    shared: _Shared,
    below: int,
    hurry: Callable[[], bool] | None = None,
) -> None:
    """`work()` on `threads` threads, the first error stopping the others at their next
    chunk and raised. The caller is one of them, unless they run `below` its priority
    (then it only waits: a thread cannot raise its own priority back); if `hurry()` turns
    true while chunks are left, the caller and `threads - 1` new threads at its own
    priority join in, taking the rest of the same queue."""

    def body(lowered: bool) -> None:
        if lowered:
            _lower(below)
        try:
            work()
        except BaseException as err:  # the fence, a disk error: stop every thread
            with shared.lock:
                shared.error = shared.error or err

    helpers = threads if below > 0 else threads - 1
    spawned = [threading.Thread(target=body, args=(below > 0,)) for _ in range(helpers)]
    for thread in spawned:
        thread.start()
    if below > 0 and hurry is not None:
        while shared.untaken() and not hurry():
            time.sleep(_HURRY_POLL_S)
        if shared.untaken():  # hurried: the rest at the caller's priority
            below = 0
            raised = [threading.Thread(target=body, args=(False,)) for _ in range(threads - 1)]
            for thread in raised:
                thread.start()
            spawned += raised
    if below <= 0:
        body(False)
    for thread in spawned:
        thread.join()
    if shared.error is not None:
        raise shared.error


def write_parallel(
    path: Path,
    plan: FilePlan,
    writers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    on_write: Callable[[int], None] | None = None,
    fsync: bool = True,
    sync: Callable[[], None] | None = None,
    below: int = 0,
    hurry: Callable[[], bool] | None = None,
    direct: bool = True,
    ready: Callable[[int], None] | None = None,
) -> int:
    """Write `plan` to `path` (created or truncated) and make it durable: `sync()` when
    given (the caller syncs this file with others), else an fsync (none with
    `fsync=False`). Returns the file's crc32, computed from the same buffers after they
    are written, while the sync waits on the disk (the checksum pass costs no wall time
    beside the flush); the sync's error, if any, is raised after it. `below` > 0: the
    writing, checksumming and syncing threads run that many nice levels under the
    caller's process (a background write that must not slow the training loop), until
    `hurry()` (polled while they work) says the write is now waited for: the rest runs
    at the process's priority (the module's docstring). `direct`: aligned pieces go with
    O_DIRECT where the file system allows it (the module's docstring). `ready(n)` blocks
    until the first `n` bytes of the plan's source are in place (it may raise: the write
    is then abandoned like on any error)."""
    chunks = -(-plan.pos // chunk_bytes)
    writers = max(1, min(writers or default_writers(), chunks))

    def lowered() -> int:  # `below`, until the write is hurried
        return 0 if hurry is not None and hurry() else below

    fds = _Fds(path, direct)
    fd = fds.buffered
    try:
        crcs: list[int | None] = [None] * chunks
        shared = _Shared(chunks, on_write)
        summer = _Summer(crcs, lowered())
        write = functools.partial(_write_chunks, fds, plan, chunk_bytes, shared, summer, ready)
        try:
            _in_threads(writers, write, shared, lowered(), hurry)
        except BaseException:
            summer.stop()
            raise
        summer.finish()
        fds.close_direct()
        if sync is None and fsync:
            sync = functools.partial(os.fsync, fd)
        syncing = _Background(sync, lowered())
        try:
            summing = _Shared(chunks, None)
            checksum = functools.partial(_checksum_chunks, plan, chunk_bytes, summing, crcs)
            _in_threads(writers, checksum, summing, lowered(), hurry)
        finally:
            syncing.join(hurry)
    finally:
        fds.close()
    crc = 0
    for index, part in enumerate(crcs):
        assert part is not None
        crc = crc32_combine(crc, part, min(chunk_bytes, plan.pos - index * chunk_bytes))
    return crc


class _Background:
    """`work()` on a thread of its own; `join()` waits for it and raises its error."""

    def __init__(self, work: Callable[[], None] | None, below: int = 0) -> None:
        self.error: BaseException | None = None
        self.thread = None
        self.work, self.below = work, below
        if work is not None:
            self.thread = threading.Thread(target=self._run, args=(work, below))
            self.thread.start()

    def _run(self, work: Callable[[], None], below: int) -> None:
        _lower(below)
        try:
            work()
        except BaseException as err:
            self.error = self.error or err

    def join(self, hurry: Callable[[], bool] | None = None) -> None:
        """Wait for the work; a lowered one that `hurry()` finds still running is run
        again on this thread, at its priority, and the first error of either raised."""
        if self.thread is None:
            return
        if self.below > 0 and hurry is not None:
            while self.thread.is_alive() and not hurry():
                self.thread.join(_HURRY_POLL_S)
            if self.thread.is_alive():
                self._run(self.work, 0)
        self.thread.join()
        if self.error is not None:
            raise self.error
