"""Find the newest complete snapshot and read it back: shared memory first, then disk.

Pure choice (`choose_step`) plus the two readers. A reader fills `into` (a state of the
same shape, e.g. the model's and optimizer's state dicts) in place when given, which is
both the fast path and the check: keys, shapes and dtypes that do not match are listed in
one error. Without `into`, fresh CPU tensors are returned (DTensors as their local shard).
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from argosy.checkpoint import disk
from argosy.checkpoint.layout import (
    SnapshotMeta,
    decode_object,
    flatten,
    local_tensor,
    mismatches,
    unflatten,
    view_of,
)
from argosy.checkpoint.segment import HEADER_BYTES, Segment, SlotState, segment_paths
from argosy.core.errors import ArgosyError


class CheckpointMismatchError(ArgosyError):
    """The checkpoint's tensors do not fit the state they are loaded into."""

    def __init__(self, step: int, problems: list[str]) -> None:
        self.problems = problems
        shown = "; ".join(problems[:20]) + (
            f"; ... {len(problems) - 20} more" if len(problems) > 20 else ""
        )
        super().__init__(f"checkpoint step {step} does not match the state: {shown}")


@dataclass(frozen=True)
class MemorySlot:
    path: Path
    step: int


def memory_slots(job: str, rank: int) -> list[MemorySlot]:
    """Complete snapshots of (job, rank) in shared memory, newest first."""
    found = []
    for path in segment_paths(job, rank):
        try:
            seg = Segment.open(path)
        except (OSError, ValueError):
            continue
        try:
            head = seg.header()
            if head is not None and head.state is SlotState.COMPLETE:
                found.append(MemorySlot(path, head.step))
        finally:
            seg.close()
    return sorted(found, key=lambda s: -s.step)


def choose_step(
    memory: list[set[int]], on_disk: list[set[int]], wanted: int | None
) -> tuple[int, bool] | None:
    """(step, from_memory) newest step every rank can load; memory preferred at equal steps."""
    in_memory = set.intersection(*memory) if memory else set()
    durable = set.intersection(*on_disk) if on_disk else set()
    candidates = in_memory | durable
    if wanted is not None:
        candidates = {wanted} & candidates
    if not candidates:
        return None
    step = max(candidates)
    return step, step in in_memory


class MappingCache:
    """Read-only mappings of slot files, kept across loads of one process.

    Mapping a multi-GB slot costs a page-table walk of every page; a process that loads
    more than once (evaluation, retries) pays it once per slot file (path, inode, size).
    """

    def __init__(self) -> None:
        self._maps: dict[Path, tuple[tuple[int, int], Segment]] = {}

    def get(self, path: Path) -> Segment:
        st = path.stat()
        key = (st.st_ino, st.st_size)
        cached = self._maps.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        if cached is not None:
            cached[1].close()
        seg = Segment.open(path, populate=True)
        self._maps[path] = (key, seg)
        return seg

    def close(self) -> None:
        for _, seg in self._maps.values():
            seg.close()
        self._maps.clear()


def read_memory(
    slot: MemorySlot, into: dict[str, Any] | None, cache: MappingCache | None = None
) -> tuple[int, dict[str, Any]] | None:
    """The slot's state, or None when it changed or tore while being read (seqlock check)."""
    own = cache is None
    seg = Segment.open(slot.path, populate=True) if own else cache.get(slot.path)
    try:
        head = seg.header()
        if head is None or head.state is not SlotState.COMPLETE or head.step != slot.step:
            return None
        meta_bytes = seg.read_meta(head)
        if meta_bytes is None:
            return None
        meta: SnapshotMeta = pickle.loads(meta_bytes)
        with warnings.catch_warnings():  # read-only mapping; only ever copied from
            warnings.simplefilter("ignore", UserWarning)
            data = torch.frombuffer(seg.map, dtype=torch.uint8)[HEADER_BYTES:]
        state = _fill(meta, functools.partial(view_of, data), into)
        del data
        after = seg.header()  # the owner may change (adoption); the snapshot must not
        if after is None or dataclasses.replace(after, owner_pid=head.owner_pid) != head:
            return None
        return meta.step, state
    finally:
        if own:
            seg.close()


def read_disk(step_dir: Path, rank: int, into: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
    """This rank's state from a committed step (checksums verified); raises TornCheckpointError.

    Tensor bytes are read straight into `into`'s tensors when they are contiguous on the
    CPU (else into fresh tensors, then copied): no staging buffer, one pass over the file.
    """
    meta, offsets = disk.read_index(step_dir, rank)
    if any(e.nbytes and e.fqn not in offsets["raw"] for e in meta.tensors):
        meta, buffer, offsets = disk.read_rank(step_dir, rank)  # records need parsing
        return meta.step, _fill(meta, lambda e: _disk_tensor(buffer, offsets, e), into)
    targets: dict[str, torch.Tensor] = {}
    if into is not None:
        flat_into, _ = flatten(into)
        problems = mismatches(meta, flat_into)
        if problems:
            raise CheckpointMismatchError(meta.step, problems)
        for entry in meta.tensors:
            local = local_tensor(flat_into[entry.fqn])[0].detach()
            if local.is_contiguous() and local.device.type == "cpu":
                targets[entry.fqn] = local
    dests = {e.fqn: targets.get(e.fqn, torch.empty(e.shape, dtype=e.dtype)) for e in meta.tensors}
    disk.read_into(step_dir, rank, meta, offsets, dests)
    return meta.step, _fill(meta, lambda e: dests[e.fqn], into, fresh=True)


def read_resharded(step_dir: Path, into: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Load with DCP's planner into `into` (any world size / sharding), after a full verify."""
    import torch.distributed.checkpoint as dcp

    problems = disk.verify(step_dir)
    if problems:
        raise disk.TornCheckpointError("; ".join(problems))
    manifest = disk.read_manifest(step_dir)
    state = dict(into)
    dcp.load(state, checkpoint_id=str(step_dir), no_dist=not _dist_on())
    return int(manifest["step"]), state


def _dist_on() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _disk_tensor(buffer: torch.Tensor, offsets: dict[str, Any], entry: Any) -> torch.Tensor:
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=entry.dtype)
    start = offsets["raw"].get(entry.fqn)
    if start is None:  # no unambiguous raw offset: parse the torch.save record
        import io

        begin, length = offsets["records"][entry.fqn]
        record = io.BytesIO(buffer[begin : begin + length].numpy().tobytes())
        return torch.load(record, weights_only=True).view(entry.shape)
    raw = buffer[start : start + entry.nbytes]
    if start % raw.element_size() or start % entry.dtype.itemsize:
        raw = raw.clone()
    return raw.view(entry.dtype).view(entry.shape)


def _fill(
    meta: SnapshotMeta, source: Any, into: dict[str, Any] | None, fresh: bool = False
) -> dict[str, Any]:
    """The state: `into`'s tensors filled from `source(entry)`, or copies (views if `fresh`)."""
    flat: dict[str, Any] = {}
    if into is not None:
        flat_into, _ = flatten(into)
        problems = mismatches(meta, flat_into)
        if problems:
            raise CheckpointMismatchError(meta.step, problems)
        for entry in meta.tensors:
            target = flat_into[entry.fqn]
            local = local_tensor(target)[0].detach()
            src = source(entry)
            if src.data_ptr() != local.data_ptr() or src.device != local.device:
                local.copy_(src)
            flat[entry.fqn] = target
    else:
        for entry in meta.tensors:
            flat[entry.fqn] = source(entry) if fresh else source(entry).clone()
    for obj in meta.objects:
        flat[obj.fqn] = decode_object(obj.payload)
    return unflatten(flat, meta.mappings)
