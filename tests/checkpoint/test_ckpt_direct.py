"""Direct I/O in the shard writer: aligned slot bytes go with O_DIRECT as they are, the
pieces between them gathered into whole blocks and written with them (only the file's last
partial block goes buffered); the file is the same bytes whichever path wrote it."""

from __future__ import annotations

import errno
import io
import mmap
import os
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint import fileplan, pwrite, records

A = pwrite.DIRECT_ALIGN
MIN = pwrite.DIRECT_MIN_BYTES


def _arena(size: int) -> tuple[mmap.mmap, memoryview]:
    """Page-aligned memory (like a slot's mapping), filled with a pattern."""
    arena = mmap.mmap(-1, size)
    view = memoryview(arena)
    pattern = bytes(range(251)) * (size // 251 + 1)
    view[:] = pattern[:size]
    return arena, view


def _supports_direct(path: Path) -> bool:
    """Whether `path`'s file system takes an aligned O_DIRECT write."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    try:
        block = mmap.mmap(-1, A)
        os.pwrite(fd, block, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        path.unlink()


# a piece: ("small", n) bytes, or ("slot", start, n) a view of the arena
piece_st = st.one_of(
    st.tuples(st.just("small"), st.integers(0, 5000)),
    st.tuples(
        st.just("slot"),
        st.integers(0, 3).map(lambda k: k * A) | st.integers(0, 9000),
        st.integers(0, 3 * MIN),
    ),
)


def _plan(view: memoryview, pieces: list[tuple]) -> tuple[fileplan.FilePlan, bytes]:
    plan, want = fileplan.FilePlan(), []
    for piece in pieces:
        if piece[0] == "small":
            blob = bytes([piece[1] % 256]) * piece[1]
        else:
            _, start, n = piece
            blob = view[start : start + n]
        plan.write(blob)
        want.append(bytes(blob))
    return plan, b"".join(want)


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(piece_st, max_size=8), pad=st.integers(0, 2 * A))
def test_split_direct_covers_every_byte_once_and_keeps_direct_runs_whole_blocks(
    pieces: list[tuple], pad: int
) -> None:
    arena, view = _arena(4 * MIN + 4 * A)
    plan, want = _plan(view, [("small", pad), *pieces])
    runs = pwrite.split_direct(plan.buffers(0, plan.pos), 0)
    at, got, direct_blocks, buffered_blocks = 0, [], set(), set()
    for offset, views, direct in runs:
        assert offset == at  # in order, back to back
        size = sum(v.nbytes for v in views)
        if direct:
            assert len(views) == 1 and size >= MIN
            assert offset % A == 0 and size % A == 0
            assert fileplan.address(views[0]) % A == 0
            direct_blocks |= set(range(offset // A, (offset + size) // A))
        elif size:
            buffered_blocks |= set(range(offset // A, (offset + size - 1) // A + 1))
        got += [bytes(v) for v in views]
        at += size
    assert b"".join(got) == want
    assert not direct_blocks & buffered_blocks  # never one block by both paths


@settings(max_examples=20, deadline=None)
@given(
    pieces=st.lists(piece_st, min_size=1, max_size=6),
    writers=st.integers(1, 4),
    chunk=st.sampled_from([1 << 20, 3 * A, 5000, MIN + 100]),
)
def test_a_file_written_with_direct_io_holds_the_same_bytes_and_crc(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[tuple], writers: int, chunk: int
) -> None:
    arena, view = _arena(4 * MIN + 4 * A)
    plan, want = _plan(view, [("small", 100), *pieces])
    path = tmp_path_factory.mktemp("direct") / "f"
    direct_ok = _supports_direct(path.parent / "probe")
    buffered: list[int] = []
    real = os.pwritev

    def counting(fd: int, buffers, offset: int) -> int:  # noqa: ANN001
        written = real(fd, buffers, offset)
        if not fcntl_direct(fd):
            buffered.append(written)
        return written

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "pwritev", counting)
        crc = pwrite.write_parallel(path, plan, writers, chunk)
    assert path.read_bytes() == want
    assert crc == zlib.crc32(want)
    if direct_ok and chunk % A == 0:  # nothing buffered but the file's last partial block
        assert sum(buffered) == len(want) % A


def test_direct_writes_are_used_where_the_file_system_allows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arena, view = _arena(2 * MIN)
    plan = fileplan.FilePlan()
    plan.write(view)
    direct_bytes = []
    real = os.pwritev

    def counting(fd: int, buffers, offset: int) -> int:  # noqa: ANN001
        written = real(fd, buffers, offset)
        if fcntl_direct(fd):
            direct_bytes.append(written)
        return written

    monkeypatch.setattr(os, "pwritev", counting)
    pwrite.write_parallel(tmp_path / "f", plan, 2, 1 << 20)
    assert (tmp_path / "f").read_bytes() == bytes(view)
    monkeypatch.setattr(os, "pwritev", real)
    expected = 2 * MIN if _supports_direct(tmp_path / "probe") else 0
    assert sum(direct_bytes) == expected


def test_a_refused_direct_write_falls_back_to_buffered_for_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arena, view = _arena(3 * MIN)
    plan = fileplan.FilePlan()
    plan.write(b"head")
    plan.write(view[4:])  # its address agrees with its file offset (4) modulo the block
    direct_ok = _supports_direct(tmp_path / "probe")  # asked before os.pwrite is patched
    real = os.pwritev
    refused = []

    def pwritev_refusing_direct(fd: int, buffers, offset: int) -> int:  # noqa: ANN001
        if fcntl_direct(fd):
            refused.append(offset)
            raise OSError(errno.EINVAL, "no direct I/O here")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev_refusing_direct)
    pwrite.write_parallel(tmp_path / "f", plan, 2, 1 << 20)
    assert (tmp_path / "f").read_bytes() == b"head" + bytes(view[4:])
    if direct_ok:
        assert refused  # the direct path was tried, refused, and the bytes still landed


def fcntl_direct(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


def test_a_large_tensor_lands_block_aligned_in_its_shard_and_reads_back(tmp_path: Path) -> None:
    out = fileplan.FilePlan()
    out.write(b"x" * 100)  # an unaligned start
    big = torch.arange(MIN // 4 + 7, dtype=torch.float32)
    small = torch.arange(1000, dtype=torch.float32)  # under DIRECT_MIN_BYTES
    big_start, big_raw = records._record(out, big, big.numel() * 4)
    big_end = out.tell()
    assert big_raw is not None and big_raw % A == 0 and big_raw > big_start >= 100
    small_start, small_raw = records._record(out, small, small.numel() * 4)
    assert small_start % 64 == 0 and (small_raw is None or small_raw % 64 == 0)
    path = tmp_path / "f"
    pwrite.write_parallel(path, out, 2, 1 << 20)
    data = path.read_bytes()
    assert data[big_raw : big_raw + big.numel() * 4] == big.numpy().tobytes()
    record = io.BytesIO(data[big_start:big_end])
    assert torch.equal(torch.load(record, weights_only=True), big)
    record = io.BytesIO(data[small_start:])
    assert torch.equal(torch.load(record, weights_only=True), small)


def _summers() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == pwrite.SUMMER_THREAD]


@pytest.mark.parametrize("fail_at", [None, 1, 3])
def test_chunks_are_summed_beside_the_writers_and_no_summer_outlives_the_write(
    tmp_path: Path, fail_at: int | None
) -> None:
    """Direct chunks are checksummed on a thread of their own; it is gone when the write
    returns, whether the write ended whole (every chunk then in the file's crc) or was
    abandoned mid-way (by `on_write`, like the writer's fence)."""
    arena, view = _arena(4 * MIN)
    plan = fileplan.FilePlan()
    plan.write(view)
    seen: list[int] = []

    def on_write(done: int) -> None:
        seen.append(done)
        if fail_at is not None and len(seen) >= fail_at:
            raise RuntimeError("fenced")

    if fail_at is None:
        crc = pwrite.write_parallel(tmp_path / "f", plan, 2, MIN // 2, on_write=on_write)
        assert crc == zlib.crc32(bytes(view))
    else:
        with pytest.raises(RuntimeError, match="fenced"):
            pwrite.write_parallel(tmp_path / "f", plan, 2, MIN // 2, on_write=on_write)
    assert _summers() == []


def test_an_error_of_a_checksum_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised whichever thread sums the chunk (the summer, or the pass beside the sync)."""
    arena, view = _arena(2 * MIN)
    plan = fileplan.FilePlan()
    plan.write(view)

    def broken(bufs: list) -> int:  # noqa: ARG001
        raise MemoryError("crc")

    monkeypatch.setattr(pwrite, "_crc_of", broken)
    with pytest.raises(MemoryError, match="crc"):
        pwrite.write_parallel(tmp_path / "f", plan, 2, MIN)
    assert _summers() == []
