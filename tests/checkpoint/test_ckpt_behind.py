"""The disk write behind the snapshot's copy: a chunk goes out only once the slot bytes it
needs have landed, it follows the copy closely only while someone waits for the write (a
flush, which the persister reads between the copy's pieces), a copy that fails stops the
write, and its step is never committed."""

from __future__ import annotations

import collections
import functools
import multiprocessing
import os
import random
import threading
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint import FlashCheckpointer, disk, fileplan, pwrite
from argosy.checkpoint.flash import CheckpointError
from argosy.checkpoint.staging import CopyFailedError, CopyProgress


def _plan_over(source: bytearray, sizes: list[int]) -> tuple[fileplan.FilePlan, list[tuple]]:
    """A plan of a header before every slice of `source` (as torch.save records are)."""
    plan, parts, at = fileplan.FilePlan(source=memoryview(source)), [], 0
    for index, n in enumerate(sizes):
        header = f"record {index}".encode()
        plan.write(header)
        plan.write(memoryview(source)[at : at + n])
        parts.append((header, at, n))
        at += n
    return plan, parts


def _copy_in(source: bytearray, final: bytes, piece: int, landed: CopyProgress) -> None:
    for at in range(0, len(final), piece):
        source[at : at + piece] = final[at : at + piece]
        landed.advance(min(len(final), at + piece))
    landed.finish()


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 200_000), min_size=1, max_size=6),
    piece=st.sampled_from([777, 65_536, 1 << 20]),
    chunk=st.sampled_from([4096, 65_536, 1 << 20]),
    writers=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_a_write_behind_the_copy_writes_only_bytes_that_landed(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    piece: int,
    chunk: int,
    writers: int,
    seed: int,
) -> None:
    final = random.Random(seed).randbytes(sum(sizes))
    source = bytearray(len(final))  # zeros until the copy lands them: a write too early shows
    plan, parts = _plan_over(source, sizes)
    landed = CopyProgress()
    copy = threading.Thread(target=_copy_in, args=(source, final, piece, landed))
    path = tmp_path_factory.mktemp("behind") / "f"
    copy.start()
    try:
        crc = pwrite.write_parallel(path, plan, writers, chunk, ready=landed.wait_for)
    finally:
        copy.join()
    want = b"".join(header + final[at : at + n] for header, at, n in parts)
    assert path.read_bytes() == want
    assert crc == zlib.crc32(want)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=8), end=st.integers(0, 60_000))
def test_source_needed_covers_every_slot_byte_before_the_end(sizes: list[int], end: int) -> None:
    source = bytearray(sum(sizes))
    plan, _ = _plan_over(source, sizes)
    needed = plan.source_needed(end)
    file_at, slot_at, wanted = 0, 0, 0
    for index, n in enumerate(sizes):
        file_at += len(f"record {index}".encode())
        if file_at < end:  # this slice starts before `end`: its bytes up to `end` are needed
            wanted = slot_at + min(n, end - file_at)
        file_at += n
        slot_at += n
    assert needed == wanted
    assert plan.source_bytes == len(source)


def test_a_copy_that_fails_stops_the_write_behind_it(tmp_path: Path) -> None:
    source = bytearray(1 << 20)
    plan, _ = _plan_over(source, [1 << 19, 1 << 19])
    landed = CopyProgress()
    landed.advance(1 << 19)  # the first half landed, then the copy failed
    landed.finish(OSError("source gone"))
    with pytest.raises(CopyFailedError, match="source gone"):
        pwrite.write_parallel(tmp_path / "f", plan, 2, 1 << 16, ready=landed.wait_for)


def test_a_snapshot_whose_copy_fails_midway_is_never_committed(
    tmp_path: Path, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {f"w{i}": torch.full((2 << 20,), float(i)) for i in range(6)}  # 8 MiB each
    faults = tmp_path.parent / f"{job}.faults"
    faults.write_text("")
    monkeypatch.setenv("ARGOSY_CKPT_FAULTS", str(faults))  # armed in the persister only
    ckpt = FlashCheckpointer(tmp_path, keep=3, job_id=job)
    try:
        ckpt.save(1, state)
        ckpt.wait()
        for value in state.values():
            value.add_(100)
        # the persister's copy fails at the 5th tensor of the next save, with the disk
        # writer already behind it (its first chunks landed)
        faults.write_text("copy:5:enospc")
        ckpt.save(2, state)
        with pytest.raises(CheckpointError, match="step 2"):
            ckpt.wait()
        assert disk.committed_steps(tmp_path) == [1]
        for value in state.values():
            value.add_(100)
        ckpt.save(3, state)
        ckpt.wait()
    finally:
        ckpt.close()
    assert disk.committed_steps(tmp_path) == [1, 3]
    assert not [p for p in os.listdir(tmp_path) if "2" in p and not p.startswith(".")]
    reader = FlashCheckpointer(tmp_path, job_id=job, prestart=False)
    try:
        step, got = reader.load()
    finally:
        reader.close()
    assert step == 3
    for name, value in state.items():
        assert torch.equal(got[name], value)


def test_a_writer_not_asked_to_follow_waits_for_the_whole_copy() -> None:
    landed, follow, returned = CopyProgress(), threading.Event(), threading.Event()

    def writer() -> None:
        landed.wait_for(100, follow=follow.is_set)
        returned.set()

    thread = threading.Thread(target=writer)
    thread.start()
    landed.advance(500)  # its bytes landed, but nobody waits for the write: it waits on
    assert not returned.wait(0.3)
    follow.set()  # a flush came: from the next piece on it follows the copy closely
    landed.advance(600)
    assert returned.wait(5)
    thread.join()
    assert not landed.finished


def test_a_writer_never_asked_to_follow_goes_when_the_copy_ends() -> None:
    landed = CopyProgress()
    threading.Timer(0.1, landed.finish).start()
    landed.wait_for(1 << 30, follow=lambda: False)  # returns once the copy ended
    assert landed.finished


def test_the_persister_takes_a_flush_during_a_copy_and_defers_the_rest() -> None:
    from argosy.checkpoint.persister import Persister

    class Writer:
        flushes = 0

        def want_flush(self) -> None:
            self.flushes += 1

    ours, theirs = multiprocessing.Pipe()
    persister = Persister.__new__(Persister)  # only what the copy's poll uses
    persister.conn, persister.cond, persister.writer = ours, threading.Condition(), Writer()
    persister.deferred = collections.deque()
    theirs.send(("forget_after", 3))
    theirs.send(("flush",))
    persister._read_flush()
    assert persister.writer.flushes == 1
    assert list(persister.deferred) == [("forget_after", 3)]  # handled after the copy
    theirs.close()
    persister._read_flush()  # the trainer went away: left to the serve loop
    assert persister.writer.flushes == 1


class _Counted(CopyProgress):
    """A CopyProgress that checks, at every announcement, that the bytes it announces are
    in the slot already, and counts the announcements. The bytes below the previous
    announcement were checked when it came; the test compares the whole slot at the end,
    so each byte is read twice, not once per later announcement (a 2 GiB draw made the
    quadratic check the bulk of the test's minutes)."""

    def __init__(self, slot: torch.Tensor, want: bytes) -> None:
        super().__init__()
        self.slot, self.want, self.told = slot, want, []

    def advance(self, copied: int) -> None:
        assert not self.told or copied > self.told[-1]
        start = self.told[-1] if self.told else 0
        assert bytes(self.slot[start:copied].numpy()) == self.want[start:copied]
        self.told.append(copied)
        super().advance(copied)


@functools.cache
def _random_pool() -> torch.Tensor:
    """Random bytes enough for the largest tensor at any shift below 64 KiB, drawn once
    (drawing every tensor afresh took a third of the test's time)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 255, ((40 << 20) + (1 << 16),), dtype=torch.uint8, generator=gen)


def _random_bytes(index: int, n: int) -> torch.Tensor:
    """`n` random bytes of their own: the pool from a shift no other index uses (4099 is
    odd, so index -> shift is one to one below 65,536 tensors)."""
    at = index * 4099 % (1 << 16)
    return _random_pool()[at : at + n].clone()


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(
        st.one_of(st.integers(0, 3000), st.integers(1 << 20, 3 << 20), st.just(40 << 20)),
        min_size=1,
        max_size=60,
    )
)
def test_a_copy_announces_landed_bytes_once_a_piece_not_once_a_tensor(sizes: list[int]) -> None:
    import tempfile

    from argosy.checkpoint.layout import SnapshotMeta, data_len, plan
    from argosy.checkpoint.pieces import PIECE_BYTES
    from argosy.checkpoint.segment import HEADER_BYTES, Segment
    from argosy.checkpoint.staging import slot_data, write_snapshot

    flat = {f"t{i}": _random_bytes(i, n) for i, n in enumerate(sizes)}
    entries, tensors, _ = plan(flat)
    meta = SnapshotMeta(1, 0, 1, {}, entries, [], data_len(entries))
    want = bytearray(meta.data_len)
    for entry, tensor in zip(entries, tensors, strict=True):
        want[entry.offset : entry.offset + entry.nbytes] = tensor.numpy().tobytes()
    scratch = tempfile.TemporaryDirectory(dir="/dev/shm")
    seg = Segment.create(Path(scratch.name) / "slot", HEADER_BYTES + meta.data_len + (1 << 20))
    try:
        data = slot_data(seg)
        data[: meta.data_len].fill_(0)
        landed, betweens = _Counted(data, bytes(want)), []
        write_snapshot(seg, data, meta, b"m", {}, tensors, None, landed, lambda: betweens.append(1))
        assert bytes(data[: meta.data_len].numpy()) == bytes(want)
        assert landed.told[-1] == entries[-1].offset + entries[-1].nbytes  # the end, whole
        assert len(landed.told) <= meta.data_len // PIECE_BYTES + 2
        assert len(betweens) <= len(landed.told)
        del data
    finally:
        seg.close()
        scratch.cleanup()
