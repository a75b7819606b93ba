"""Held slots change hands once: an orphaned persister never takes a newer trainer's, and
no persister maps one file as two slots (two slots on one file let a copy overwrite bytes
the disk writer is writing: a committed step that fails its checksum, or holds another
step's bytes under a good one)."""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import time
from pathlib import Path

import pytest
import torch

from argosy.checkpoint import CheckpointError, FlashCheckpointer, restore
from argosy.checkpoint.persister import Persister, PersisterSpec
from argosy.checkpoint.segment import (
    SHM_DIR,
    Header,
    Segment,
    SlotState,
    held_name,
    job_segments,
    segment_name,
)


def _state(value: float) -> dict:
    return {"big": torch.full((1 << 16,), value), "meta": {"step": int(value)}}


def _owner(path: Path) -> int:
    seg = Segment.open(path)
    try:
        head = seg.header()
        assert head is not None, f"{path.name} has no header"
        return head.owner_pid
    finally:
        seg.close()


def test_an_orphaned_persister_leaves_a_newer_trainers_held_slot_alone(tmp_path, job):
    old = FlashCheckpointer(tmp_path, job_id=job, linger_s=30, commit_timeout_s=10)
    old.save(1, _state(1.0))
    old.wait()
    # a trainer restarted in the same process: its persister starts while it holds step 2
    new = FlashCheckpointer(tmp_path, job_id=job, linger_s=30, commit_timeout_s=10, prestart=False)
    try:
        new.save(2, _state(2.0))
        held = SHM_DIR / held_name(job, 0, 0)
        assert held.exists() and not new._ready
        atexit.unregister(old.close)
        old._launch.close()  # the old trainer's end goes away, as when it is SIGKILLed
        assert old._proc.wait(timeout=60) == 0  # fenced: it lets go and exits
        assert _owner(held) == os.getpid(), "the orphan took the newer trainer's held slot"
        new.save(3, _state(3.0))
        assert new.wait() == 3
        assert new.load(into=_state(0.0))[1]["big"].eq(3.0).all()
    finally:
        new.close()


def test_a_held_slot_handed_over_twice_is_one_slot(tmp_path, job):
    path = SHM_DIR / held_name(job, 0, 0)
    seg = Segment.create(path, 1 << 16)
    seg.close()
    spec = _spec(tmp_path, job)
    persister = Persister(spec, conn=None)
    try:
        persister._adopt_held(path)  # no header yet: no snapshot
        assert [s.step for s in persister.slots] == [None]
        seg = Segment.open(path, writable=True)  # the trainer completes step 7 in it
        meta = pickle.dumps({"step": 7})
        crc = seg.write_meta(16, meta)
        seg.write_header(Header(SlotState.COMPLETE, 7, 16, len(meta), crc, os.getpid()))
        seg.close()
        persister._adopt_held(path)  # handed over: the same file, now holding step 7
        assert [s.step for s in persister.slots] == [7]
    finally:
        persister._release(unlink=True)
    assert not path.exists()


def test_a_message_to_a_dead_persister_is_a_checkpoint_error(tmp_path, job):
    ckpt = FlashCheckpointer(tmp_path, job_id=job, linger_s=0, commit_timeout_s=5)
    try:
        ckpt.save(1, _state(1.0))
        ckpt.wait()
        os.kill(ckpt.persister_pid, signal.SIGKILL)
        ckpt._proc.wait(timeout=30)
        with pytest.raises(CheckpointError, match="exited unexpectedly"):
            ckpt._send(("flush",))  # the pipe is broken: named, not a raw BrokenPipeError
    finally:
        with contextlib.suppress(CheckpointError):
            ckpt.close(timeout_s=5)
        for seg_path in job_segments(job):
            seg_path.unlink()


def _spec(tmp_path: Path, job: str) -> PersisterSpec:
    return PersisterSpec(
        directory=str(tmp_path),
        job=job,
        rank=0,
        world_size=1,
        keep=2,
        slots=2,
        linger_s=0.0,
        commit_timeout_s=1.0,
        persist_interval_s=0.0,
        shm_dir=str(SHM_DIR),
        parent_pid=os.getpid(),
        epoch=1,
    )


def test_adoption_leaves_a_slot_file_being_created_in_place(tmp_path, job):
    """A slot file smaller than a header may be another process's, between its open and
    its truncate: deleting it would drop the snapshot about to go in. Only one that has
    stayed that small for a minute (a crashed creation) is removed."""
    young = SHM_DIR / segment_name(job, 0, 0)
    old = SHM_DIR / segment_name(job, 0, 1)
    young.write_bytes(b"")
    old.write_bytes(b"x" * 100)
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    persister = Persister(_spec(tmp_path, job), conn=None)
    try:
        persister._adopt_existing()
        assert young.exists(), "a slot file being created was deleted"
        assert not old.exists(), "a crashed creation's debris was kept"
        assert persister.slots == []
    finally:
        persister._release(unlink=True)
        young.unlink(missing_ok=True)


def test_forgetting_a_snapshot_mid_write_marks_its_slot_empty(tmp_path, job):
    """A given-up step the disk writer is writing stays out of every later load: its
    header says EMPTY at once (the writer reads only the data), not once the write ends."""
    path = SHM_DIR / held_name(job, 0, 0)
    seg = Segment.create(path, 1 << 16)
    meta = pickle.dumps({"step": 9})
    crc = seg.write_meta(16, meta)
    seg.write_header(Header(SlotState.COMPLETE, 9, 16, len(meta), crc, os.getpid()))
    seg.close()
    persister = Persister(_spec(tmp_path, job), conn=None)
    try:
        persister._adopt_held(path)
        (slot,) = persister.slots
        slot.persisting = True  # the disk writer is writing step 9
        persister._forget_after(5)
        assert slot.stale and slot.step == 9, "the writer's slot changed under it"
        reader = Segment.open(path)
        try:
            head = reader.header()
            assert head is not None and head.state is SlotState.EMPTY, head
        finally:
            reader.close()
        assert [s.step for s in restore.memory_slots(job, 0)] == []
    finally:
        persister._release(unlink=True)
    assert not path.exists()
