"""A replayed layout (records.py) is the file a fresh one gives, for any set of tensors."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.checkpoint import disk, fileplan, records
from argosy.checkpoint.layout import ObjectEntry, SnapshotMeta, data_len, encode_object, plan

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.float16]

tensor_specs = st.lists(
    st.tuples(
        st.sampled_from(DTYPES),
        st.one_of(
            st.lists(st.integers(0, 40), min_size=0, max_size=3),  # small, scalar, empty
            st.just([1 << 19]),  # 1 MiB or more: raw bytes aligned for direct I/O
        ),
    ),
    min_size=1,
    max_size=8,
)


def _meta(specs: list, step: int, rank: int = 0) -> tuple[SnapshotMeta, list[torch.Tensor]]:
    flat: dict = {
        f"t{i}": torch.zeros(shape, dtype=dtype) for i, (dtype, shape) in enumerate(specs)
    }
    flat["step"] = step  # an object: different at every step
    entries, tensors, keys = plan(flat)
    objects = [ObjectEntry(k, encode_object(flat[k])) for k in keys]
    return SnapshotMeta(step, rank, 2, {}, entries, objects, data_len(entries)), tensors


def _slot(meta: SnapshotMeta, fill: int) -> memoryview:
    return memoryview(bytearray([fill]) * meta.data_len)


def _file(meta: SnapshotMeta, data: memoryview) -> tuple[bytes, tuple]:
    out = fileplan.FilePlan(source=data)
    items, raw, recs, digest = records.lay_out(out, meta, data, disk.data_file(meta.rank))
    body = b"".join(bytes(piece) for _, piece in out.pieces)
    assert len(body) == out.pos
    assert [pos for pos, _ in out.pieces] == [pos for pos, _ in out.writes]
    ends = range(0, out.pos + 1, max(1, out.pos // 37))  # what a write behind the copy waits for
    needed = tuple(out.source_needed(end) for end in ends)
    return body, (items, raw, recs, out.source_bytes, needed, digest)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=tensor_specs,
    rank=st.integers(0, 1),
    fills=st.tuples(st.integers(0, 255), st.integers(0, 255)),
)
def test_a_replayed_layout_is_byte_for_byte_a_fresh_one(specs, rank, fills):
    first, _ = _meta(specs, step=1, rank=rank)
    second, _ = _meta(specs, step=2, rank=rank)  # same tensors, another object payload
    records.forget()
    _file(first, _slot(first, fills[0]))  # remembered from here on
    replayed = _file(second, _slot(second, fills[1]))
    records.forget()
    fresh = _file(second, _slot(second, fills[1]))
    assert replayed == fresh
    # every tensor byte is referenced inside the slot, never copied (a write behind the copy)
    assert replayed[1][3] == sum(e.nbytes for e in second.tensors)
    assert replayed[1][5] is not None  # remembered layouts are named by a digest


def test_another_layout_is_laid_out_afresh():
    a, _ = _meta([(torch.float32, [4])], step=1)
    b, _ = _meta([(torch.float32, [5])], step=2)  # one more element: another layout
    records.forget()
    first = _file(a, _slot(a, 1))
    mixed = _file(b, _slot(b, 1))
    records.forget()
    assert mixed == _file(b, _slot(b, 1))
    assert first[1][5] != mixed[1][5]


def test_only_the_newest_layouts_are_kept():
    records.forget()
    for n in range(records.TEMPLATES_KEPT + 3):
        meta, _ = _meta([(torch.float32, [n + 1])], step=n)
        _file(meta, _slot(meta, 0))
    assert len(records._templates) == records.TEMPLATES_KEPT


@pytest.mark.parametrize("replay", [False, True], ids=["fresh", "replayed"])
def test_a_shard_written_from_a_replayed_layout_reads_back(tmp_path, replay):
    meta, _ = _meta([(torch.float32, [1 << 18]), (torch.int64, [3, 5])], step=7)
    values = {"t0": torch.arange(1 << 18) / 3, "t1": torch.arange(15).reshape(3, 5)}
    data = bytearray(meta.data_len)
    for entry in meta.tensors:
        raw = values[entry.fqn].to(entry.dtype).view(torch.uint8).reshape(-1).numpy()
        data[entry.offset : entry.offset + entry.nbytes] = raw.tobytes()
    records.forget()
    if replay:
        _file(meta, _slot(meta, 9))  # the same layout, laid out over another slot first
    disk.write_rank(tmp_path, meta, memoryview(data))
    body = (tmp_path / disk.data_file(meta.rank)).read_bytes()
    _, index = pickle.loads((tmp_path / f"rank{meta.rank}.meta").read_bytes())
    for fqn, value in values.items():
        start, length = index["records"][fqn]
        loaded = torch.load(io.BytesIO(body[start : start + length]))
        assert torch.equal(loaded, value.to(loaded.dtype))
        raw = index["raw"][fqn]
        assert (
            body[raw : raw + value.nbytes] == value.view(torch.uint8).reshape(-1).numpy().tobytes()
        )
