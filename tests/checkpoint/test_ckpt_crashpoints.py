"""Crash anywhere in the commit order: never a torn step in sight, never a lost commit.

The persister's real disk writer (writer.py) persists a run of steps in this process; at a
crash point drawn by hypothesis it raises `faultpoints.Crash`, which unwinds past every
`except Exception` and leaves the files as a SIGKILL there would. The next attempt (a
higher epoch, a fresh writer) goes on. After every step: every committed step verifies
against its manifest, the newest commit is the newest step whose commit returned (or a
later one), its bytes are that step's, and nothing of a crashed attempt is ever listed
as committed. With two ranks, rank 1's shard is staged beside rank 0's.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint import commit as cm
from argosy.checkpoint import disk, faultpoints, restore
from argosy.checkpoint.layout import ObjectEntry, SnapshotMeta, data_len, encode_object, plan
from argosy.checkpoint.persister import PersisterSpec
from argosy.checkpoint.writer import Writer

# points a step passes in the writer, in order ("copy" is the persister's, not the writer's)
WRITER_POINTS = ("write", "publish", "metadata", "commit", "renamed")


def snapshot(step: int, rank: int, world: int) -> tuple[SnapshotMeta, bytearray]:
    """A step's snapshot as a slot holds it: metadata and the data region's bytes."""
    gen = torch.Generator().manual_seed(step * 31 + rank)
    flat = {
        "w": torch.randn(3000, generator=gen),
        "b": torch.randint(0, 9, (17,), generator=gen),
        "n": step,
    }
    entries, tensors, objects = plan(flat)
    objs = [ObjectEntry(k, encode_object(flat[k])) for k in objects]
    paths = {k: (k,) for k in flat}
    meta = SnapshotMeta(step, rank, world, paths, entries, objs, data_len(entries))
    data = bytearray(meta.data_len)
    for entry, tensor in zip(entries, tensors, strict=True):
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
        data[entry.offset : entry.offset + entry.nbytes] = raw
    return meta, data


@dataclasses.dataclass
class FakeSegment:
    data: bytearray

    def data_view(self, length: int) -> memoryview:
        return memoryview(self.data)[:length]


@dataclasses.dataclass
class FakeSlot:
    step: int
    meta: SnapshotMeta
    segment: FakeSegment
    persisting: bool = False
    stale: bool = False
    landing: Any = None


class FakeHost:
    """The persister's side of the writer: its slots, a condition and a message log."""

    def __init__(self) -> None:
        self.slots: list[Any] = []
        self.cond = threading.Condition()
        self.sent: list[tuple] = []

    def send(self, *msg: Any) -> None:
        self.sent.append(msg)


def spec(directory: Path, epoch: int, world: int) -> PersisterSpec:
    return PersisterSpec(str(directory), "crashpoints", 0, world, 2, 2, 0.0, 5.0, 0.0, "", 0, epoch)


def persist(directory: Path, step: int, epoch: int, world: int) -> str | None:
    """One step through rank 0's real writer (rank 1's shard staged beside it); None when
    committed, else why not. faultpoints.Crash propagates."""
    meta, data = snapshot(step, 0, world)
    writer = Writer(spec(directory, epoch, world), FakeHost())
    staging = directory / cm.tmp_dir_name(step, epoch)
    if world == 2:
        staging.mkdir(parents=True, exist_ok=True)
        other, other_data = snapshot(step, 1, world)
        piece = disk.write_rank(staging, other, memoryview(other_data))
        cm.publish(staging, piece, epoch)
    slot = FakeSlot(step, meta, FakeSegment(data))
    return writer._persist_as_coordinator(step, meta, slot)


def check_directory(directory: Path, world: int, newest_done: int | None) -> None:
    """The invariants after every step, crashed or not."""
    steps = disk.committed_steps(directory)
    for step in steps:
        assert disk.verify(directory / disk.step_dir_name(step)) == [], f"step {step} torn"
    if newest_done is None:
        return
    assert steps and steps[-1] >= newest_done, f"commit of step {newest_done} lost: {steps}"
    newest = steps[-1]
    for rank in range(world):
        want_meta, want = snapshot(newest, rank, world)
        _, buffer, offsets = disk.read_rank(directory / disk.step_dir_name(newest), rank)
        for entry in want_meta.tensors:
            got = buffer[offsets["raw"][entry.fqn] :][: entry.nbytes].numpy().tobytes()
            assert got == bytes(want[entry.offset : entry.offset + entry.nbytes]), entry.fqn
    _, state = restore.read_disk(directory / disk.step_dir_name(newest), 0, None)
    assert state["n"] == newest


@settings(max_examples=25, deadline=None)
@given(
    world=st.sampled_from([1, 2]),
    crashes=st.lists(
        st.tuples(st.sampled_from(WRITER_POINTS), st.integers(1, 3)), min_size=1, max_size=3
    ),
)
def test_a_crash_at_any_point_leaves_whole_steps_only(
    tmp_path_factory: pytest.TempPathFactory, world: int, crashes: list[tuple[str, int]]
) -> None:
    directory = tmp_path_factory.mktemp("crash")
    epoch, newest_done, crashed = 1, None, 0
    plan_of_faults = list(crashes)
    try:
        faultpoints.arm(":".join(map(str, (*plan_of_faults.pop(0), "crash"))))
        for step in range(1, 7):
            cm.Fence(directory).raise_to(epoch)
            try:
                reason = persist(directory, step, epoch, world)
            except faultpoints.Crash as crash:
                crashed += 1
                past_rename = crash.args[0] == "renamed"
                assert (step in disk.committed_steps(directory)) == past_rename, crash.args
                reason = None if past_rename else "crashed"
                epoch += 1  # the restarted attempt: a new epoch fences the old one out
                nxt = plan_of_faults.pop(0) if plan_of_faults else None
                faultpoints.arm(":".join(map(str, (*nxt, "crash"))) if nxt else "")
            if reason is None:
                newest_done = step
            check_directory(directory, world, newest_done)
        faultpoints.arm("")
        cm.Fence(directory).raise_to(epoch)
        assert persist(directory, 7, epoch, world) is None, "after the crashes, a step commits"
        check_directory(directory, world, 7)
        cm.prune(directory, keep=2, epoch=epoch)
        assert cm.staging_dirs(directory) == {}, "a crashed attempt's staging is pruned"
    finally:
        faultpoints.arm("")
    assert crashed >= 1  # every first crash point is reached within six steps


@pytest.mark.parametrize("point", WRITER_POINTS)
def test_each_point_is_reached_once_per_step_in_this_order(tmp_path: Path, point: str) -> None:
    """A crash at the first visit of every point happens, and only the steps before it
    (and, past the rename, the step itself) are committed."""
    cm.Fence(tmp_path).raise_to(1)
    assert persist(tmp_path, 1, epoch=1, world=1) is None
    faultpoints.arm(f"{point}:1:crash")
    try:
        with pytest.raises(faultpoints.Crash):
            persist(tmp_path, 2, epoch=1, world=1)
    finally:
        faultpoints.arm("")
    want = [1, 2] if point == "renamed" else [1]
    assert disk.committed_steps(tmp_path) == want
    check_directory(tmp_path, 1, want[-1])
