"""The parallel file writer: same bytes and crc32 as a sequential write, for any chunking."""

from __future__ import annotations

import errno
import os
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint import crc, fileplan, pwrite

pieces_st = st.lists(st.binary(min_size=0, max_size=3000), min_size=0, max_size=12)


@settings(max_examples=100, deadline=None)
@given(a=st.binary(max_size=5000), b=st.binary(max_size=5000))
def test_crc32_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    combined = crc.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b))
    assert combined == zlib.crc32(a + b)
    assert crc.crc32(a + b) == zlib.crc32(a + b)  # ISA-L's crc32 is zlib's checksum


@settings(max_examples=30, deadline=None)
@given(
    pieces=pieces_st,
    big=st.integers(0, 3),
    writers=st.integers(1, 5),
    chunk=st.sampled_from([1, 7, 512, 4096, 1 << 16]),
)
def test_parallel_write_equals_sequential(
    tmp_path_factory: pytest.TempPathFactory,
    pieces: list[bytes],
    big: int,
    writers: int,
    chunk: int,
) -> None:
    # large pieces are kept by reference: they must land byte for byte too
    large = [bytes(range(256)) * (fileplan.BY_REFERENCE_BYTES // 256 + i) for i in range(big)]
    blobs = pieces + large
    plan = fileplan.FilePlan()
    for blob in blobs:
        plan.write(bytearray(blob))
    path = tmp_path_factory.mktemp("pw") / "f"
    seen: list[int] = []
    crc = pwrite.write_parallel(path, plan, writers, chunk, on_write=seen.append)
    want = b"".join(blobs)
    assert path.read_bytes() == want
    assert crc == zlib.crc32(want)
    if want:
        assert max(seen) == len(want)  # progress reaches the whole file, never beyond


def test_large_pieces_are_referenced_not_copied(tmp_path: Path) -> None:
    buffer = bytearray(fileplan.BY_REFERENCE_BYTES * 2)
    plan = fileplan.FilePlan()
    plan.write(b"head")
    plan.write(buffer)
    buffer[:4] = b"late"  # changed after the layout: the write sees the change
    pwrite.write_parallel(tmp_path / "f", plan, 2, 4096)
    assert (tmp_path / "f").read_bytes()[4:8] == b"late"


def test_an_abort_from_on_write_stops_every_writer(tmp_path: Path) -> None:
    plan = fileplan.FilePlan()
    plan.write(bytearray(1 << 20))
    calls: list[int] = []

    def fence(done: int) -> None:
        calls.append(done)
        raise RuntimeError("fenced")

    with pytest.raises(RuntimeError, match="fenced"):
        pwrite.write_parallel(tmp_path / "f", plan, 4, 4096, on_write=fence)
    assert len(calls) <= 4  # each writer stops at its first chunk


def test_a_disk_error_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, bufs: list, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pwrite.os, "pwritev", full)
    plan = fileplan.FilePlan()
    plan.write(bytearray(1 << 18))
    with pytest.raises(OSError, match="No space left"):
        pwrite.write_parallel(tmp_path / "f", plan, 2, 4096)


def test_the_sync_runs_once_every_byte_is_written_and_its_error_is_raised(tmp_path: Path) -> None:
    """The crc pass runs beside the caller's sync: the sync sees the whole file, the crc is
    still the file's, and a failed sync (EIO at flush) fails the write."""
    blob = bytes(range(256)) * 1024
    plan = fileplan.FilePlan()
    plan.write(b"head")
    plan.write(bytearray(blob))
    path = tmp_path / "f"
    seen: list[bytes] = []
    crc = pwrite.write_parallel(path, plan, 2, 4096, sync=lambda: seen.append(path.read_bytes()))
    assert seen == [b"head" + blob]
    assert crc == zlib.crc32(b"head" + blob)

    def broken() -> None:
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output"):
        pwrite.write_parallel(path, plan, 2, 4096, sync=broken)


def test_a_background_write_runs_below_the_caller_and_a_waited_one_at_its_level(
    tmp_path: Path,
) -> None:
    """`below`: the threads that write, checksum and sync sit that many nice levels under
    the process (a persist behind training); 0: at its level (a flush the trainer waits
    for). The caller's own priority never changes (it could not be raised back)."""
    plan = fileplan.FilePlan()
    plan.write(bytearray(1 << 18))
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for below, want in ((3, min(19, mine + 3)), (0, mine)):
        writing: set[int] = set()
        syncing: list[int] = []

        def level(_: int = 0, seen: set[int] = writing) -> None:
            seen.add(os.getpriority(os.PRIO_PROCESS, 0))

        def synced(seen: list[int] = syncing) -> None:
            seen.append(os.getpriority(os.PRIO_PROCESS, 0))

        pwrite.write_parallel(
            tmp_path / "f", plan, 2, 4096, on_write=level, sync=synced, below=below
        )
        assert writing == {want} and syncing == [want], (below, writing, syncing)
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine


def test_a_write_hurried_midway_takes_the_rest_at_the_callers_priority(tmp_path: Path) -> None:
    """A lowered write that `hurry()` finds waited for mid-way: threads at the process's
    own priority take the chunks left in the same queue (the lowered ones are held at
    their first hurried chunk until one has), each chunk written once, the bytes and crc
    whole, and the sync, started after, runs unlowered."""
    blob = os.urandom(64 * 4096)
    plan = fileplan.FilePlan()
    plan.write(bytearray(blob))
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    low = min(19, mine + 3)
    assert low != mine, "the test process must run below nice 19"
    hurried, unlowered_wrote = threading.Event(), threading.Event()
    levels: list[int] = []
    syncing: list[int] = []

    def on_write(_: int) -> None:
        level = os.getpriority(os.PRIO_PROCESS, 0)
        levels.append(level)
        if level == mine:
            unlowered_wrote.set()
        elif hurried.is_set():  # a lowered thread may go on only once the rest is taken over
            unlowered_wrote.wait(10)
        hurried.set()

    def synced() -> None:
        syncing.append(os.getpriority(os.PRIO_PROCESS, 0))

    crc = pwrite.write_parallel(
        tmp_path / "f", plan, 2, 4096, on_write=on_write, sync=synced, below=3,
        hurry=hurried.is_set,
    )  # fmt: skip
    assert (tmp_path / "f").read_bytes() == blob and crc == zlib.crc32(blob)
    assert len(levels) == 64  # one call per chunk: none written twice, none skipped
    assert levels[0] == low and mine in levels, levels
    assert syncing == [mine]
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine


def test_a_lowered_sync_hurried_midway_is_run_again_at_the_callers_priority(
    tmp_path: Path,
) -> None:
    """The sync of a background write started lowered; a flush arrives while it runs: a
    second sync at the process's priority runs beside it, and an error of either is
    raised."""
    plan = fileplan.FilePlan()
    plan.write(bytearray(1 << 16))
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    low = min(19, mine + 3)
    assert low != mine, "the test process must run below nice 19"
    for failing in (None, low, mine):
        hurried, second = threading.Event(), threading.Event()
        levels: list[int] = []

        def sync(levels: list[int] = levels, hurried=hurried, second=second, failing=failing):
            level = os.getpriority(os.PRIO_PROCESS, 0)
            levels.append(level)
            if level == low:
                hurried.set()
                assert second.wait(10), "no sync at the caller's priority came"
            else:
                second.set()
            if level == failing:
                raise OSError(errno.EIO, "Input/output error")

        if failing is None:
            pwrite.write_parallel(tmp_path / "f", plan, 2, 4096, sync=sync, below=3,
                                  hurry=hurried.is_set)  # fmt: skip
        else:
            with pytest.raises(OSError, match="Input/output"):
                pwrite.write_parallel(tmp_path / "f", plan, 2, 4096, sync=sync, below=3,
                                      hurry=hurried.is_set)  # fmt: skip
        assert sorted(levels) == sorted([low, mine]), (failing, levels)
