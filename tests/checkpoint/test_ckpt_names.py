"""Slot names are reused across attempts: a snapshot must never be lost to a name's reuse,
and `wait` must never report a step durable that was not committed."""

from __future__ import annotations

import os

import pytest

from argosy.checkpoint import CheckpointError, FlashCheckpointer
from argosy.checkpoint import disk as ckdisk
from argosy.checkpoint.persister import Persister, PersisterSpec, _adopt
from argosy.checkpoint.segment import SHM_DIR, Header, Segment, SlotState, held_name, job_segments


def test_wait_raises_when_a_held_snapshot_is_gone_before_the_hand_over(tmp_path, job, ck):
    ckpt = FlashCheckpointer(tmp_path, job_id=job, prestart=False)
    try:
        ckpt.save(1, ck.small_state())  # the persister is only starting: held by the trainer
        held = [p for p in job_segments(job) if "-sh" in p.name]
        assert held, "the snapshot was held in the trainer's own slot"
        for path in held:  # what a lingering persister of the killed attempt did, by name
            path.unlink()
        with pytest.raises(CheckpointError, match="step 1|held in"):
            ckpt.wait()
        assert ckdisk.committed_steps(tmp_path) == []
    finally:
        ckpt.close()


def test_letting_go_never_unlinks_a_slot_name_a_newer_trainer_reused(tmp_path, job):
    spec = PersisterSpec(str(tmp_path), job, 0, 1, 2, 2, 0.0, 5.0, 0.0, str(SHM_DIR), 0, 1)
    persister = Persister(spec, None)
    path = SHM_DIR / held_name(job, 0, 0)
    old = Segment.create(path, 3 * 4096)
    old.write_header(Header(SlotState.EMPTY, -1, 0, 0, 0, 0))
    persister.slots.append(_adopt(old))  # the killed trainer's held slot, adopted
    path.unlink()  # the newer trainer's first hold: the same name, a new file
    new = Segment.create(path, 3 * 4096)
    new.write_header(Header(SlotState.COMPLETE, 4, 0, 0, 0, os.getpid()))
    try:
        persister._release(unlink=True)  # the linger ended
        assert path.exists(), "the newer trainer's held snapshot was unlinked"
    finally:
        new.close()
        path.unlink(missing_ok=True)
