"""A file laid out before it is written: every piece at its file offset, nothing copied
that need not be.

    plan = FilePlan(source=slot_view)           # pieces inside the slot: by reference
    plan.write(b"header")                       # small pieces elsewhere are kept as bytes
    plan.write(slot_view[a:b])                  # slot bytes (and large pieces): never copied
    pwrite.write_parallel(path, plan, ...)      # written at disk speed (pwrite.py)

Contract:
- `FilePlan` is a write-only file object (what `torch.save` writes into): it records every
  piece at its file offset. Pieces that lie inside `source` (the snapshot's slot) and
  pieces of at least `BY_REFERENCE_BYTES` are kept as views of the caller's buffer (which
  must hold its final bytes by the time they are written); smaller ones are copied. For
  the pieces of `source` it also records which of its bytes each file range needs
  (`source_needed`: a write behind the snapshot's copy waits for them).
- `layout()` gives what was written as a `PlanLayout` independent of the source (ranges
  of it, and bytes), and `replay(layout)` rebuilds the same plan over another source of
  the same layout at once (records.py replays a rank's tensor records so).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

BY_REFERENCE_BYTES = 1 << 16


class FilePlan:
    """A write-only file object that records pieces at offsets instead of writing them."""

    def __init__(self, source: memoryview | None = None) -> None:
        self.pieces: list[tuple[int, Any]] = []
        """(file offset, bytes or a byte memoryview), in file order, back to back."""
        self.writes: list[tuple[int, int]] = []
        """(offset, length) of every `write` call: where the caller's buffers landed."""
        self.pos = 0
        self.source = source
        self._base = address(source) if source is not None else 0
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
            at = self.source_offset(view)
            if at is not None:
                self._from_source.append((self.pos, at, view.nbytes))
                self._needed_before.append(max(self._needed_before[-1], at + view.nbytes))
            by_reference = at is not None or view.nbytes >= BY_REFERENCE_BYTES
            self.pieces.append((self.pos, view if by_reference else bytes(view)))
        self.pos += view.nbytes
        return view.nbytes

    @property
    def source_bytes(self) -> int:
        """Bytes of the pieces that lie inside `source`."""
        return sum(length for _, _, length in self._from_source)

    def source_offset(self, view: memoryview) -> int | None:
        """Where `view` starts inside `source`; None when it is not wholly inside it."""
        if self.source is None or not self.source.nbytes:
            return None
        at = address(view) - self._base
        return at if at >= 0 and at + view.nbytes <= self.source.nbytes else None

    def source_needed(self, end: int) -> int:
        """How many leading bytes of `source` must be in place to write [0, end)."""
        index = bisect.bisect_left(self._from_source, (end,)) - 1
        if index < 0:
            return 0
        offset, at, length = self._from_source[index]
        return max(self._needed_before[index], at + min(length, end - offset))

    def tell(self) -> int:
        return self.pos

    def layout(self) -> PlanLayout | None:
        """What was written so far, to `replay` over another source of the same layout:
        pieces of `source` as (offset, length) ranges of it, the rest as bytes (runs of
        them joined); None when a piece is neither (a large piece outside `source`, kept
        by reference: it could be gone by the next replay)."""
        pieces: list[tuple[int, bytes | tuple[int, int]]] = []
        for pos, piece in self.pieces:
            if isinstance(piece, bytes):
                if pieces and isinstance(pieces[-1][1], bytes):
                    pieces[-1] = (pieces[-1][0], pieces[-1][1] + piece)
                else:
                    pieces.append((pos, piece))
                continue
            at = self.source_offset(piece)
            if at is None:
                return None
            pieces.append((pos, (at, piece.nbytes)))
        return PlanLayout(
            tuple(pieces), tuple(self._from_source), tuple(self._needed_before), self.pos
        )

    def replay(self, layout: PlanLayout) -> None:
        """Into this empty plan, what `layout` recorded, its ranges taken from this plan's
        own `source`: the plan a fresh layout over it gives (but for `writes`, and header
        runs joined), without the per-write work (1,024 tensors: 0.4 ms against 5 ms)."""
        assert self.pos == 0 and self.source is not None
        source = self.source
        self.pieces = [
            (pos, p if isinstance(p, bytes) else source[p[0] : p[0] + p[1]])
            for pos, p in layout.pieces
        ]
        self.writes = [(pos, _length(p)) for pos, p in layout.pieces]
        self._from_source = list(layout.from_source)
        self._needed_before = list(layout.needed_before)
        self.pos = layout.pos

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


@dataclass(frozen=True)
class PlanLayout:
    """A FilePlan's pieces, independent of its source (`FilePlan.layout`)."""

    pieces: tuple[tuple[int, bytes | tuple[int, int]], ...]
    from_source: tuple[tuple[int, int, int], ...]
    needed_before: tuple[int, ...]
    pos: int


def _length(piece: bytes | tuple[int, int]) -> int:
    return len(piece) if isinstance(piece, bytes) else piece[1]


def address(view: memoryview) -> int:
    """Where a byte view's memory starts."""
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0
