"""The two-phase commit: fenced by epoch, aborted for all by one refusal, never torn."""

from __future__ import annotations

import pickle

import pytest
import torch
from ckpt_helpers import meta_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.checkpoint import commit as cm
from argosy.checkpoint import disk
from argosy.checkpoint.layout import SnapshotMeta


def _slot_of(meta: SnapshotMeta, tensors: list) -> memoryview:
    """The slot's data region of a snapshot of `tensors` described by `meta`."""
    buffer = bytearray(meta.data_len)
    for entry, tensor in zip(meta.tensors, tensors, strict=True):
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
        buffer[entry.offset : entry.offset + entry.nbytes] = raw
    return memoryview(buffer)


def _meta(step: int, rank: int, world: int) -> tuple[SnapshotMeta, memoryview]:
    state = {"w": torch.full((1024,), float(step * 10 + rank)), "n": step}
    meta, tensors = meta_of(state, step, rank, world)
    return meta, _slot_of(meta, tensors)


def stage(directory, step: int, epoch: int, world: int = 2) -> tuple:
    """Phase 1 of every rank: shards written and published."""
    staging = directory / cm.tmp_dir_name(step, epoch)
    staging.mkdir(parents=True)
    metas, pieces = [], []
    for rank in range(world):
        meta, data = _meta(step, rank, world)
        piece = disk.write_rank(staging, meta, data)
        cm.publish(staging, piece, epoch)
        metas.append(meta)
        pieces.append(piece)
    return staging, metas, pieces


def test_a_commit_is_one_rename_of_a_manifest_naming_every_shard(tmp_path):
    fence = cm.Fence(tmp_path)
    fence.raise_to(5)
    staging, metas, _ = stage(tmp_path, 10, epoch=5)
    got = cm.collect(staging, 2, epoch=5)
    assert got.refusal is None and [p.rank for p in got.pieces] == [0, 1]
    final = cm.commit(tmp_path, 10, 5, metas, got.pieces, fence)
    assert final == tmp_path / disk.step_dir_name(10) and not staging.exists()
    manifest = disk.read_manifest(final)
    assert manifest["epoch"] == 5 and manifest["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", "rank0.meta", "rank1.meta"} <= set(manifest["files"])
    assert disk.verify(final) == []
    assert disk.read_rank(final, 1)[0].step == 10


def test_a_fenced_epoch_cannot_commit_and_its_staging_is_pruned(tmp_path):
    fence = cm.Fence(tmp_path)
    fence.raise_to(5)
    staging, metas, pieces = stage(tmp_path, 10, epoch=5)
    assert cm.Fence(tmp_path).raise_to(6) == 6  # a newer attempt looked at the directory
    with pytest.raises(cm.FencedError):
        cm.commit(tmp_path, 10, 5, metas, pieces, fence)
    assert disk.committed_steps(tmp_path) == []
    cm.prune(tmp_path, keep=3, epoch=6)
    assert not staging.exists()
    assert cm.Fence(tmp_path).raise_to(4) == 6  # the fence never goes back


def test_a_writer_checks_the_fence_within_a_chunk(tmp_path):
    fence = cm.Fence(tmp_path)
    fence.raise_to(7)
    assert not fence.fenced(7)
    cm.Fence(tmp_path).raise_to(8)
    fence._checked = 0.0  # the cache is at most 0.1 s old in use
    with pytest.raises(cm.FencedError):
        fence.check(7)


@pytest.mark.parametrize("kind", ["skip", "failed"])
def test_one_refusing_rank_aborts_the_step_for_all(tmp_path, kind):
    fence = cm.Fence(tmp_path)
    fence.raise_to(1)
    staging, metas, pieces = stage(tmp_path, 5, epoch=1)
    cm.commit(tmp_path, 5, 1, metas, pieces, fence)
    staging = tmp_path / cm.tmp_dir_name(10, 1)
    staging.mkdir()
    meta, data = _meta(10, 0, 2)
    cm.publish(staging, disk.write_rank(staging, meta, data), 1)
    cm.refuse(staging, 1, kind, "disk full")
    got = cm.collect(staging, 2, epoch=1)
    assert got.pieces is None and got.refusal[0] == kind and "disk full" in got.refusal[1]
    cm.abort(staging, got.refusal[1])
    assert cm.aborted(staging)
    assert disk.committed_steps(tmp_path) == [5]  # the previous commit stays the newest


def test_a_done_marker_of_another_epoch_is_refused(tmp_path):
    staging, _, pieces = stage(tmp_path, 10, epoch=3)
    cm.publish(staging, pieces[1], epoch=2)  # a writer of an older attempt
    got = cm.collect(staging, 2, epoch=3)
    assert got.pieces is None and "epoch 2" in got.refusal[1]


def test_a_shard_shorter_than_announced_is_never_committed(tmp_path):
    fence = cm.Fence(tmp_path)
    staging, metas, pieces = stage(tmp_path, 10, epoch=0)
    path = staging / disk.data_file(1)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="rank 1 wrote"):
        cm.commit(tmp_path, 10, 0, metas, pieces, fence)
    assert disk.committed_steps(tmp_path) == []


def test_a_step_committed_already_is_kept_and_the_copy_dropped(tmp_path):
    fence = cm.Fence(tmp_path)
    staging, metas, pieces = stage(tmp_path, 10, epoch=1)
    first = cm.commit(tmp_path, 10, 1, metas, pieces, fence)
    before = (first / disk.MANIFEST).read_bytes()
    staging, metas, pieces = stage(tmp_path, 10, epoch=2)
    assert cm.commit(tmp_path, 10, 2, metas, pieces, cm.Fence(tmp_path)) is None
    assert (first / disk.MANIFEST).read_bytes() == before and not staging.exists()


def test_a_torn_step_committed_earlier_is_replaced_whole(tmp_path):
    staging, metas, pieces = stage(tmp_path, 10, epoch=1)
    first = cm.commit(tmp_path, 10, 1, metas, pieces, cm.Fence(tmp_path))
    data = first / disk.data_file(1)
    data.write_bytes(data.read_bytes()[:-5])  # torn after its commit
    assert disk.verify(first)
    staging, metas, pieces = stage(tmp_path, 10, epoch=2)
    assert cm.commit(tmp_path, 10, 2, metas, pieces, cm.Fence(tmp_path)) == first
    assert disk.verify(first) == [] and disk.read_manifest(first)["epoch"] == 2
    assert not staging.exists()


def test_staging_names_carry_step_and_epoch():
    name = cm.tmp_dir_name(40, 1795433157516910)
    assert cm.parse_tmp(name) == (40, 1795433157516910)
    assert cm.parse_tmp("step_000000000040") is None
    assert pickle.loads(pickle.dumps(name)) == name


def test_rank_0_collects_with_its_own_piece_in_hand(tmp_path):
    """Rank 0 publishes no marker of its own: it hands its piece to `collect`, which waits
    for the other ranks' markers only and returns every piece in rank order."""
    fence = cm.Fence(tmp_path)
    staging = tmp_path / cm.tmp_dir_name(10, 0)
    staging.mkdir()
    metas, pieces = [], []
    for rank in range(3):
        meta, data = _meta(10, rank, 3)
        metas.append(meta)
        pieces.append(disk.write_rank(staging, meta, data))
    cm.publish(staging, pieces[2], 0)
    assert cm.collect(staging, 3, 0, own=pieces[0]).pieces is None  # rank 1 still writes
    cm.publish(staging, pieces[1], 0)
    got = cm.collect(staging, 3, 0, own=pieces[0])
    assert not (staging / "rank0.done").exists()
    assert got.refusal is None and [p.rank for p in got.pieces] == [0, 1, 2]
    assert got.pieces[0] is pieces[0]
    final = cm.commit(tmp_path, 10, 0, metas, got.pieces, fence)
    assert disk.verify(final) == []


def _step_of(specs: tuple, step: int, payload: int, nested: bool) -> tuple:
    """One rank-0 step of a world of 1: tensors named by `specs` (sizes), an object of
    `payload` bytes, the tensors nested ({"m": {"w0": ...}}) or flat ({"m.w0": ...})."""
    tensors = {f"w{i}": torch.full((n,), float(step)) for i, n in enumerate(specs)}
    state = {"m": tensors} if nested else {f"m.{k}": v for k, v in tensors.items()}
    state["extra"] = b"x" * payload
    meta, values = meta_of(state, step)
    return meta, _slot_of(meta, values)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from([(3,), (3, 5), (5, 3), (1 << 10,)]),
            st.integers(0, 3),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_metadata_of_a_commit_is_what_a_fresh_build_gives(tmp_path_factory, steps):
    """Over any sequence of steps (tensors kept or changed, objects that grow, the same
    names nested another way), the `.metadata` a commit writes is the fresh one, whether
    the memo of the last commit answered or not."""
    directory = tmp_path_factory.mktemp("memo")
    last: tuple = (None, b"")
    for step, (specs, payload, nested) in enumerate(steps):
        meta, data = _step_of(specs, step, payload, nested)
        staging = directory / cm.tmp_dir_name(step, 0)
        staging.mkdir()
        piece = disk.write_rank(staging, meta, data)
        assert piece.layout is not None
        fresh = cm._dcp_metadata([meta], [piece])
        got = cm.dcp_metadata_bytes([meta], [piece])
        assert pickle.loads(got) == fresh  # bytes may differ: pickle memoizes by identity
        if last[0] == (specs, payload, nested):
            assert got is last[1]  # the memo answered
        last = ((specs, payload, nested), got)
        final = cm.commit(directory, step, 0, [meta], [piece], cm.Fence(directory))
        assert pickle.loads((final / cm.METADATA).read_bytes()) == fresh
