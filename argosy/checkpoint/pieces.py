"""A snapshot's copy into its slot: cut into pieces, copied by a few threads at once.

Each large contiguous host tensor becomes `PIECE_BYTES` pieces copied with a plain
`memmove` (it releases the GIL; in the persister glibc's makes non-temporal stores from
256 KiB on, launch.py); anything else (bytes that travel inline, a strided
tensor) is one piece copied by torch. The calling thread and `threads - 1` helpers take
the next piece whenever they are free, so a thread that gets less of the CPU copies fewer
pieces instead of holding the copy up. That matters here: right after a parallel op
(the trainer's last kernel, or the benchmark's floor) OpenMP keeps the trainer's idle
workers spinning for milliseconds, and a copy split in equal halves between two threads
ran as slow as its thread beside the spinner (the stall was 1.15x the memcpy floor with
libgomp's default wait policy, 2.1x with OMP_WAIT_POLICY=active; benchmarks/RESULTS.md).

Someone waiting for the snapshot on disk (`narrow()`: a flush came) wants the disk
writer fed more than the copy finished: the helpers then stop taking pieces and the
calling thread copies the rest alone, leaving the writer threads and the kernel's
direct-I/O submission a core (on the 2-core VM a durable save went from 1.19-1.23x to
1.13-1.15x the disk floor; one thread copies at ~90% of two threads' speed).

`PiecePlanner` remembers the pieces of each slot while the entries, the sources and the
inline set stay the same (a persister copies the same state at every save).

`copy_pieces` reports pieces in slot order, in the calling thread, once each piece and
every one before it are in place (`passed(piece)`): the disk writer follows that prefix,
and a crash point there counts every piece once whichever thread copied it. It returns
only after every helper stopped, so nothing writes into a slot whose copy failed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from argosy.checkpoint.layout import view_of

PIECE_BYTES = 16 << 20
"""A large tensor is copied in pieces of this size (a thread's unit of work, and how far
ahead of the disk writer the copy may be before it hears of it)."""
MAX_THREADS = 8
"""Copy threads per snapshot at most: a few saturate a socket's memory bandwidth, and a
node runs one persister per rank."""


@dataclass(frozen=True)
class Piece:
    """Bytes `[end - nbytes, end)` of the slot's data region, and how to put them there."""

    end: int
    nbytes: int
    copy: Callable[[], Any]


def copy_threads() -> int:
    """Threads a copy uses: one per core this process may run on, at most MAX_THREADS."""
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


def plan_pieces(
    data: torch.Tensor,
    entries: list[Any],
    inline: dict[int, bytes],
    sources: list[torch.Tensor | None],
) -> list[Piece]:
    """The pieces that copy every entry's bytes into `data` (a flat uint8 slot region), in
    slot order. Raw addresses are used only after checking that the source holds exactly
    the entry's bytes and that they fit in `data`: a wrong index must fail, not scribble."""
    pieces, inline_at = _plan(data, entries, inline.keys(), sources)
    return _with_inline(pieces, inline_at, data, entries, inline)


class PiecePlanner:
    """`plan_pieces`, remembered per slot: a persister copies the same entries from the
    same sources into the same few slots at every save, and planning 1,024 tensors took
    1.6-6 ms of the stall. A plan is reused while the slot's region, the sources (the same
    list object: the persister's, replaced whole when the trainer sends new ones), the
    entries and which of them travel inline are what they were; the inline pieces carry
    this save's bytes."""

    KEPT = 8

    def __init__(self) -> None:
        self._kept: dict[tuple[int, int], _Kept] = {}

    def plan(
        self,
        data: torch.Tensor,
        entries: list[Any],
        inline: dict[int, bytes],
        sources: list[torch.Tensor | None],
    ) -> list[Piece]:
        region = (data.data_ptr(), data.numel())
        kept = self._kept.get(region)
        if kept is None or not (
            kept.sources is sources and kept.inline == inline.keys() and kept.entries == entries
        ):
            pieces, inline_at = _plan(data, entries, inline.keys(), sources)
            if len(self._kept) >= self.KEPT:
                self._kept.clear()
            kept = _Kept(sources, set(inline), list(entries), pieces, inline_at)
            self._kept[region] = kept
        return _with_inline(kept.pieces, kept.inline_at, data, entries, inline)


class _Kept(NamedTuple):
    """A slot's remembered plan and what it was made from."""

    sources: list[torch.Tensor | None]
    inline: set[int]
    entries: list[Any]
    pieces: list[Piece | None]
    inline_at: list[tuple[int, int]]


def _plan(
    data: torch.Tensor,
    entries: list[Any],
    inline: Any,
    sources: list[torch.Tensor | None],
) -> tuple[list[Piece | None], list[tuple[int, int]]]:
    """`plan_pieces` but for the inline entries (`inline`: their indexes), whose places
    are left None: (pieces, [(place, entry index)])."""
    pieces: list[Piece | None] = []
    inline_at: list[tuple[int, int]] = []
    for index, entry in enumerate(entries):
        end = entry.offset + entry.nbytes
        if end > data.numel():
            raise ValueError(f"{entry.fqn}: bytes {entry.offset}..{end} past the slot's data")
        if index in inline:
            inline_at.append((len(pieces), index))
            pieces.append(None)
            continue
        source = sources[index]
        if source is None:
            raise ValueError(f"no source for {entry.fqn}")
        if source.numel() * source.element_size() != entry.nbytes:
            raise ValueError(f"{entry.fqn}: its source has other than {entry.nbytes} bytes")
        if not (source.is_contiguous() and source.device.type == "cpu"):
            strided = functools.partial(_copy_view, data, entry, source)
            pieces.append(Piece(end, entry.nbytes, strided))
            continue
        into, out_of = data.data_ptr() + entry.offset, source.data_ptr()
        for start in range(0, entry.nbytes or 1, PIECE_BYTES):  # an empty one too: a piece
            n = min(PIECE_BYTES, entry.nbytes - start)
            move = functools.partial(ctypes.memmove, into + start, out_of + start, n)
            pieces.append(Piece(entry.offset + start + n, n, move))
    return pieces, inline_at


def _with_inline(
    pieces: list[Piece | None],
    inline_at: list[tuple[int, int]],
    data: torch.Tensor,
    entries: list[Any],
    inline: dict[int, bytes],
) -> list[Piece]:
    out: list[Any] = list(pieces)  # every None is replaced below
    for place, index in inline_at:
        entry = entries[index]
        put = functools.partial(_put, data, entry, inline[index])
        out[place] = Piece(entry.offset + entry.nbytes, entry.nbytes, put)
    return out


def _put(data: torch.Tensor, entry: Any, payload: bytes) -> None:
    if payload:
        dst = data[entry.offset : entry.offset + entry.nbytes]
        dst.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))


def _copy_view(data: torch.Tensor, entry: Any, source: torch.Tensor) -> None:
    view_of(data, entry).copy_(source)


class _Shared:
    """The pieces, the next one to take, which are done, and the first error."""

    def __init__(self, pieces: list[Piece], narrow: Callable[[], bool] | None) -> None:
        self.pieces = pieces
        self.narrow = narrow
        self.done = [False] * len(pieces)
        self.error: BaseException | None = None
        self._next = 0
        self._lock = threading.Lock()

    def claim(self) -> int | None:
        with self._lock:
            if self.error is not None or self._next >= len(self.pieces):
                return None
            self._next += 1
            return self._next - 1

    def copy(self, index: int) -> None:
        self.pieces[index].copy()
        self.done[index] = True

    def fail(self, err: BaseException) -> None:
        with self._lock:
            self.error = self.error or err

    def help(self) -> None:
        """A helper thread's body: copy pieces until none is left or a copy failed."""
        try:
            while not (self.narrow is not None and self.narrow()):
                if (index := self.claim()) is None:
                    return
                self.copy(index)
        except BaseException as err:  # handed to the calling thread, which raises it
            self.fail(err)


def copy_pieces(
    pieces: list[Piece],
    passed: Callable[[Piece], None],
    threads: int | None = None,
    narrow: Callable[[], bool] | None = None,
) -> None:
    """Copy every piece with `threads` threads (this one included); `passed(piece)` runs
    here, in slot order, once the piece and all before it are in place. Once `narrow()`
    says so, the helpers take no more pieces and this thread copies the rest: a copy that
    a disk writer follows leaves it a core. Raises the first error of any thread, or of
    `passed`, after every helper has stopped."""
    shared = _Shared(pieces, narrow)
    wanted = copy_threads() if threads is None else threads
    helpers = [
        threading.Thread(target=shared.help, name="slot-copy", daemon=True)
        for _ in range(min(wanted, len(pieces)) - 1)
    ]
    for helper in helpers:
        helper.start()
    reported = 0
    try:
        while (index := shared.claim()) is not None:
            shared.copy(index)
            while reported < len(pieces) and shared.done[reported]:
                passed(pieces[reported])
                reported += 1
    except BaseException as err:
        shared.fail(err)
    for helper in helpers:
        helper.join()
    if shared.error is not None:
        raise shared.error
    for piece in pieces[reported:]:
        passed(piece)
