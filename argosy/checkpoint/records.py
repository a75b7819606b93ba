"""A rank's data file laid out as DCP's torch.save records, once per layout.

    items, raw_offsets, records, digest = lay_out(plan, meta, data, "__0_0.distcp")

`lay_out` writes into `plan` (a `fileplan.FilePlan` over the snapshot's slot `data`) one
torch.save record per tensor, then every object's payload, and returns what the index
and DCP's metadata need: the (MetadataIndex, _StorageInfo) items, where each tensor's raw
bytes start, where each record lies, and a digest naming the tensor part (`Laid`).

Contract:
- A tensor's record references its bytes in `data` (never copies them); a large tensor's
  raw bytes land at a `DIRECT_ALIGN`-aligned file offset, like its bytes in the slot, so
  pwrite.py writes them with direct I/O; other records start 64-aligned.
- The records are a pure function of the tensor entries (name, dtype, shape, offset,
  size, sharding) and the file's name: torch.save writes the same headers for the same
  tensors whatever their bytes. So the first layout of a rank's tensors is kept as a
  template (header bytes, and (offset, length) ranges of `data`) and a later step with
  the same entries replays it against its own slot: byte for byte the file a fresh
  layout gives, without a torch.save call per tensor (~0.2 ms each: 0.2 s before the
  first byte reaches the disk for a state of 1,000 tensors). Objects, which change from
  step to step, are written fresh every time. `TEMPLATES_KEPT` layouts are remembered
  per process, the newest first.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from argosy.checkpoint.fileplan import PlanLayout
    from argosy.checkpoint.layout import SnapshotMeta, TensorEntry

TEMPLATES_KEPT = 4


@dataclass(frozen=True)
class _Tensors:
    """The tensor records of one layout. `plan`, to replay it over another slot
    (`FilePlan.replay`); None when it cannot be replayed."""

    items: tuple[tuple[Any, Any], ...]
    raw_offsets: dict[str, int]
    records: dict[str, tuple[int, int]]
    plan: PlanLayout | None
    digest: bytes | None
    """Names the tensor entries and their items (`Laid.digest`); None with `plan`."""


class Laid(NamedTuple):
    """What `lay_out` returns."""

    items: list[tuple[Any, Any]]
    """(MetadataIndex, _StorageInfo) of every tensor record (rank 0's, or a shard's) and,
    on rank 0, of every object, in that order."""
    raw_offsets: dict[str, int]
    records: dict[str, tuple[int, int]]
    digest: bytes | None
    """A digest of the file's name, the rank, its tensor entries and their items: equal
    digests, equal tensor items and entries (so a commit may reuse what it derived from
    them, commit.py); None for a layout that is not remembered."""


_templates: OrderedDict[tuple, _Tensors] = OrderedDict()
_lock = threading.Lock()


def lay_out(out: Any, meta: SnapshotMeta, data: memoryview, name: str) -> Laid:
    """Every tensor as a torch.save record (DCP's format) and every object, into `out`
    (a FilePlan over `data`). See the module's contract."""
    key = (name, meta.rank, tuple(meta.tensors))
    tensors = _recall(key)
    if tensors is None:
        tensors = _lay_out_tensors(out, meta, data, name)
        if tensors.plan is not None:
            _remember(key, tensors)
    else:
        assert tensors.plan is not None and out.source is data
        out.replay(tensors.plan)
    items = list(tensors.items)
    for obj in meta.objects:
        start = out.tell()
        out.write(obj.payload)
        if meta.rank == 0:
            items.append(_item(obj.fqn, None, name, start, len(obj.payload)))
    return Laid(items, dict(tensors.raw_offsets), dict(tensors.records), tensors.digest)


def forget() -> None:
    """Drop every remembered layout (tests compare against fresh ones)."""
    with _lock:
        _templates.clear()


def _recall(key: tuple) -> _Tensors | None:
    with _lock:
        found = _templates.get(key)
        if found is not None:
            _templates.move_to_end(key, last=False)
        return found


def _remember(key: tuple, tensors: _Tensors) -> None:
    with _lock:
        _templates[key] = tensors
        _templates.move_to_end(key, last=False)
        while len(_templates) > TEMPLATES_KEPT:
            _templates.popitem()


def _lay_out_tensors(out: Any, meta: SnapshotMeta, data: memoryview, name: str) -> _Tensors:
    """The torch.save records of every tensor, into `out` (empty so far).

    The records' zip entries carry no crc32 of their own (torch.load does not check it,
    and computing it is one more pass over the bytes): the manifest's crc32 covers the
    whole file.
    """
    from torch.utils.serialization import config

    assert out.tell() == 0
    items: list[tuple[Any, Any]] = []
    raw_offsets: dict[str, int] = {}
    records: dict[str, tuple[int, int]] = {}
    saved_crc = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        for entry in meta.tensors:
            start, raw = _record(out, _exact_tensor(data, entry), entry.nbytes)
            if raw is not None:  # else ambiguous: the reader parses the torch.save record
                raw_offsets[entry.fqn] = raw
            records[entry.fqn] = (start, out.tell() - start)
            if meta.rank == 0 or entry.sharded:
                items.append(_item(entry.fqn, entry.global_offset, name, start, out.tell() - start))
    finally:
        config.save.compute_crc32 = saved_crc
    plan = out.layout()
    digest = None
    if plan is not None:
        named = pickle.dumps((name, meta.rank, meta.tensors, items))
        digest = hashlib.blake2b(named, digest_size=16).digest()
    return _Tensors(tuple(items), raw_offsets, records, plan, digest)


def _record(out: Any, tensor: Any, nbytes: int) -> tuple[int, int | None]:
    """Lay out `tensor`'s torch.save record in `out`, after padding; returns where the
    record starts and where its raw bytes start (None when that is ambiguous: more than
    one piece of the record has their length). A large tensor's raw bytes land at a
    `DIRECT_ALIGN`-aligned file offset, like its bytes in the slot, so pwrite.py writes
    them with direct I/O; other records start 64-aligned (so do their raw bytes). Its
    pieces inside the slot (`out.source`) stay references (a write behind the copy)."""
    import torch

    from argosy.checkpoint import fileplan, pwrite

    record = fileplan.FilePlan(source=getattr(out, "source", None))
    torch.save(tensor, record)  # its offsets count from the record's start
    raw = [pos for pos, n in record.writes if n == nbytes]
    if nbytes >= pwrite.DIRECT_MIN_BYTES and len(raw) == 1:
        pad = -(out.tell() + raw[0]) % pwrite.DIRECT_ALIGN
    else:
        pad = -out.tell() % 64
    if pad:
        out.write(bytes(pad))
    start = out.tell()
    for _, piece in record.pieces:
        out.write(piece)
    return start, start + raw[0] if len(raw) == 1 else None


def _item(fqn: str, offset: Any, name: str, start: int, length: int) -> tuple[Any, Any]:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    index = MetadataIndex(fqn) if offset is None else MetadataIndex(fqn, offset)
    return index, _StorageInfo(name, start, length)


def _exact_tensor(data: memoryview, entry: TensorEntry) -> torch.Tensor:
    """A tensor whose storage is exactly the entry's bytes, so torch.save writes only them."""
    import torch

    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=entry.dtype)
    raw = torch.frombuffer(data[entry.offset : entry.offset + entry.nbytes], dtype=torch.uint8)
    return raw.view(entry.dtype).view(entry.shape)
