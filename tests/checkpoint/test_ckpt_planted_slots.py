"""Slots in /dev/shm are found by name, and job ids are public: a slot another user
planted (or a link) must never be restored from, since restoring unpickles its metadata."""

from __future__ import annotations

import os
import pickle
import zlib

import pytest

from argosy.checkpoint.restore import memory_slots
from argosy.checkpoint.segment import (
    HEADER_BYTES,
    SHM_DIR,
    Header,
    Segment,
    SlotState,
    segment_name,
)


class Boom:
    """What a planted slot's metadata would run when unpickled."""

    def __reduce__(self):  # noqa: ANN204
        return (os.system, ("touch /tmp/argosy-planted-slot-ran",))


def plant(job: str, rank: int, slot: int, step: int) -> Segment:
    meta = pickle.dumps(Boom())
    seg = Segment.create(SHM_DIR / segment_name(job, rank, slot), HEADER_BYTES + 4096)
    seg.map[HEADER_BYTES : HEADER_BYTES + len(meta)] = meta
    seg.write_header(Header(SlotState.COMPLETE, step, 0, len(meta), zlib.crc32(meta), os.getpid()))
    return seg


def test_a_slot_of_another_user_is_never_restored(job, monkeypatch) -> None:
    seg = plant(job, 0, 9, 10**6)
    try:
        assert [s.step for s in memory_slots(job, 0)] == [10**6]  # ours: it is a slot
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # seen by another user
        assert memory_slots(job, 0) == []
        with pytest.raises(PermissionError, match="not a file of this user"):
            Segment.open(seg.path)
    finally:
        seg.close()
        seg.path.unlink(missing_ok=True)


def test_a_link_under_a_slot_name_is_neither_read_nor_written_through(job, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 1024)
    link = SHM_DIR / segment_name(job, 0, 3)
    link.symlink_to(victim)
    try:
        assert memory_slots(job, 0) == []
        with pytest.raises(OSError):
            Segment.create(link, HEADER_BYTES + 4096)  # would truncate the target
        assert victim.read_bytes() == b"precious" * 1024
    finally:
        link.unlink()
