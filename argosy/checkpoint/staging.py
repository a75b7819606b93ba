"""What the persister copies from: the state's own tensors, shared, or pinned host stages.

CPU: a tensor's storage is moved into shared memory once (`share_memory_()`, the same
move `model.share_memory()` makes); parameters and optimizer state keep their identity, so
later saves send nothing but a step number. Tensors too small to be worth a handle (and
storages that cannot be shared) travel inline as bytes.

Accelerator: each tensor is copied, on a side stream, into a pinned, shared host buffer
allocated once; the persister then copies from those buffers while training goes on.

The persister's copy into a slot (`write_snapshot`, in pieces on a few threads: pieces.py)
reports how far it got through a `CopyProgress`, which the disk writer follows: a snapshot
is written to disk while it is still landing in its slot.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from argosy.checkpoint import faultpoints
from argosy.checkpoint.pieces import (
    PIECE_BYTES,
    Piece,
    PiecePlanner,
    copy_pieces,
    plan_pieces,
)
from argosy.checkpoint.segment import HEADER_BYTES, Header, Segment, SlotState


def _inline_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def share_sources(tensors: list[torch.Tensor], inline_limit: int) -> list[torch.Tensor | None]:
    """Per tensor: the shared tensor the persister reads, or None when its bytes travel
    inline (`inline_bytes_of`): a small one, or one whose storage cannot be shared."""
    sources: list[torch.Tensor | None] = []
    for tensor in tensors:
        tensor = tensor.detach()
        if tensor.numel() * tensor.element_size() <= inline_limit:
            sources.append(None)
            continue
        if not tensor.untyped_storage().is_shared():  # Tensor.is_shared: 10x the cost
            try:
                tensor.share_memory_()
            except RuntimeError:
                sources.append(None)
                continue
        sources.append(tensor)
    return sources


def inline_bytes_of(
    tensors: list[torch.Tensor], sources: list[torch.Tensor | None]
) -> dict[int, bytes]:
    """The current bytes of the tensors without a shared source, by index."""
    pairs = enumerate(zip(tensors, sources, strict=True))
    return {index: _inline_bytes(tensor) for index, (tensor, source) in pairs if source is None}


class DeviceStager:
    """Pinned shared host buffers, reused across saves, filled on a side stream."""

    def __init__(self) -> None:
        self.buffers: dict[int, torch.Tensor] = {}
        self.stream = None
        self.event = None

    def stage(
        self, tensors: list[torch.Tensor], inline_limit: int
    ) -> tuple[list[torch.Tensor | None], dict[int, bytes]]:
        from argosy.hardware.backends.host_memory import pin_shared

        sources: list[torch.Tensor | None] = []
        inline: dict[int, bytes] = {}
        device = next(t.device for t in tensors if t.device.type != "cpu")
        if self.stream is None:
            self.stream = torch.Stream(device)
        self.stream.wait_stream(torch.accelerator.current_stream(device))
        for index, tensor in enumerate(tensors):
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes <= inline_limit:
                sources.append(None)
                inline[index] = _inline_bytes(tensor)
                continue
            buf = self.buffers.get(index)
            if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
                buf = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
                pin_shared(buf)
                self.buffers[index] = buf
            with self.stream:
                buf.copy_(tensor.detach(), non_blocking=True)
            sources.append(buf)
        self.event = self.stream.record_event()
        return sources, inline

    def synchronize(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def close(self) -> None:
        from argosy.hardware.backends.host_memory import unpin

        for buf in self.buffers.values():
            unpin(buf)
        self.buffers.clear()


class CopyFailedError(Exception):
    """The snapshot never landed whole in its slot: nothing of it may be published."""


class CopyProgress:
    """How far a snapshot has landed in its slot: the disk writer follows it, so the write
    runs behind the copy instead of after it.

    The copy calls `advance(n)` once the slot's first `n` data bytes are in place, then
    `finish()` (or `finish(error)`); the writer calls `wait_for(n)` before it writes bytes
    that need them, and `wait_for(None)` before it says its shard is whole.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.copied = 0
        self.finished = False
        self.error: BaseException | None = None

    def advance(self, copied: int) -> None:
        with self._cond:
            self.copied = max(self.copied, copied)
            self._cond.notify_all()

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            self.finished, self.error = True, error
            self._cond.notify_all()

    def wait_for(
        self,
        nbytes: int | None,
        check: Callable[[], None] | None = None,
        follow: Callable[[], bool] | None = None,
    ) -> None:
        """Until `nbytes` are in place (None: until the copy ended); CopyFailedError when
        the copy failed first. `check()` runs every 0.1 s while waiting (a fence: it may
        raise to give up). `follow()`, when given, says whether to follow the copy
        closely now; while it says no, this waits for the whole copy (asked again at
        every piece that lands)."""
        with self._cond:
            while not self.finished and (
                nbytes is None or self.copied < nbytes or (follow is not None and not follow())
            ):
                self._cond.wait(0.1)
                if check is not None:
                    check()
            if self.error is not None:
                raise CopyFailedError(f"the snapshot's copy into its slot failed: {self.error!r}")


def write_snapshot(
    seg: Segment,
    data: torch.Tensor,
    meta: Any,
    meta_bytes: bytes,
    inline: dict[int, bytes],
    sources: list[torch.Tensor | None],
    on_copy: Callable[[int], None] | None = None,
    landed: CopyProgress | None = None,
    between: Callable[[], None] | None = None,
    threads: int | None = None,
    narrow: Callable[[], bool] | None = None,
    planner: PiecePlanner | None = None,
) -> None:
    """Copy one snapshot into a slot: WRITING first, COMPLETE (with the metadata checksum)
    only once every byte is in place, so a copy cut short is never read as good. The copy
    runs in pieces on `threads` threads (pieces.py); `landed` learns how far, in slot
    order, the copy got (a disk writer may follow it; `finish` is the caller's), and
    `between()` runs (the persister reads a flush that came meanwhile) once per
    `PIECE_BYTES` of progress, not per tensor: a state of a thousand small tensors would
    otherwise wake the disk writer a thousand times, for nothing it can write yet.
    `narrow()`: whether the copy should go on with one thread; `planner` remembers the
    pieces of the slots it saw (pieces.py)."""
    owner = os.getpid()
    seg.write_header(Header(SlotState.WRITING, meta.step, meta.data_len, 0, 0, owner))
    plan = plan_pieces if planner is None else planner.plan
    planned = plan(data, meta.tensors, inline, sources)
    last = planned[-1] if planned else None
    told = 0  # slot bytes `landed` knows of

    def passed(piece: Piece) -> None:
        nonlocal told
        if piece.end - told >= PIECE_BYTES or piece is last:
            told = piece.end
            if landed is not None:
                landed.advance(piece.end)
            if between is not None and piece is not last:
                between()
        if on_copy is not None:  # the persister's copy: the trainer's held one has none
            on_copy(piece.nbytes)
            faultpoints.reach("copy")

    copy_pieces(planned, passed, threads, narrow)
    crc = seg.write_meta(meta.data_len, meta_bytes)
    seg.write_header(
        Header(SlotState.COMPLETE, meta.step, meta.data_len, len(meta_bytes), crc, owner)
    )


def slot_data(seg: Segment) -> torch.Tensor:
    """The slot's data region as a flat uint8 tensor (a view of the mapping)."""
    return torch.frombuffer(seg.map, dtype=torch.uint8)[HEADER_BYTES:]
