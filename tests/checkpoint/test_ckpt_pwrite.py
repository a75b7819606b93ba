"""The parallel file writer: same bytes and crc32 as a sequential write, for any split."""

from __future__ import annotations

import errno
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint import crc, pwrite

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
    large = [bytes(range(256)) * (pwrite.BY_REFERENCE_BYTES // 256 + i) for i in range(big)]
    blobs = pieces + large
    plan = pwrite.FilePlan()
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
    buffer = bytearray(pwrite.BY_REFERENCE_BYTES * 2)
    plan = pwrite.FilePlan()
    plan.write(b"head")
    plan.write(buffer)
    buffer[:4] = b"late"  # changed after the layout: the write sees the change
    pwrite.write_parallel(tmp_path / "f", plan, 2, 4096)
    assert (tmp_path / "f").read_bytes()[4:8] == b"late"


def test_an_abort_from_on_write_stops_every_writer(tmp_path: Path) -> None:
    plan = pwrite.FilePlan()
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
    plan = pwrite.FilePlan()
    plan.write(bytearray(1 << 18))
    with pytest.raises(OSError, match="No space left"):
        pwrite.write_parallel(tmp_path / "f", plan, 2, 4096)


@settings(max_examples=25, deadline=None)
@given(
    layout=st.lists(st.tuples(st.booleans(), st.integers(1, 70_000)), min_size=1, max_size=10),
    writers=st.integers(1, 4),
    chunk=st.sampled_from([4096, 1 << 15, 1 << 17]),
)
def test_a_write_behind_the_copy_lands_the_final_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    layout: list[tuple[bool, int]],
    writers: int,
    chunk: int,
) -> None:
    """The plan is laid out while the source is still empty; a copier thread then fills it
    slowly, and every chunk must wait for exactly the source bytes it needs."""
    import threading
    import time

    from argosy.checkpoint.staging import CopyProgress

    total = sum(n for from_source, n in layout if from_source)
    want_source = bytes((i * 7 + 3) % 251 for i in range(total))
    source = bytearray(total)
    view = memoryview(source)
    plan = pwrite.FilePlan(source=view if total else None)
    want, at = [], 0
    for from_source, n in layout:
        if from_source:
            plan.write(view[at : at + n])  # a slot's bytes, not there yet
            want.append(want_source[at : at + n])
            at += n
        else:
            plan.write(bytearray(b"h" * n))  # a record header: in place already
            want.append(b"h" * n)
    landed = CopyProgress()

    def copy() -> None:
        step = max(1, total // 7)
        for start in range(0, total, step):
            time.sleep(0.002)
            source[start : start + step] = want_source[start : start + step]
            landed.advance(min(total, start + step))
        landed.finish()

    copier = threading.Thread(target=copy)
    copier.start()
    path = tmp_path_factory.mktemp("behind") / "f"
    crc = pwrite.write_parallel(path, plan, writers, chunk, ready=landed.wait_for)
    copier.join()
    assert path.read_bytes() == b"".join(want)
    assert crc == zlib.crc32(b"".join(want))


def test_a_failed_copy_fails_the_write(tmp_path: Path) -> None:
    from argosy.checkpoint.staging import CopyFailedError, CopyProgress

    source = bytearray(1 << 16)
    plan = pwrite.FilePlan(source=memoryview(source))
    plan.write(memoryview(source))
    landed = CopyProgress()
    landed.advance(100)
    landed.finish(OSError("the trainer's tensor vanished"))
    with pytest.raises(CopyFailedError, match="vanished"):
        pwrite.write_parallel(tmp_path / "f", plan, 2, 4096, ready=landed.wait_for)
