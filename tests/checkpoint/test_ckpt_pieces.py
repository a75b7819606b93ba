"""The copy into a slot in pieces (pieces.py): every byte lands, pieces are reported in
slot order only once they and all before them are in place, a slow thread copies fewer
pieces, and no thread writes after the copy failed."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint.layout import data_len, plan
from argosy.checkpoint.pieces import (
    PIECE_BYTES,
    Piece,
    PiecePlanner,
    copy_pieces,
    plan_pieces,
)

SIZES = st.one_of(st.integers(0, 5000), st.integers(1 << 20, 2 << 20), st.just(PIECE_BYTES + 3))


def _state(sizes: list[int], strided: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(len(sizes))
    flat = {}
    for i, n in enumerate(sizes):
        t = torch.randint(0, 255, (n,), dtype=torch.uint8, generator=gen)
        if strided and i % 3 == 1 and n >= 2:  # every third one: not contiguous
            t = torch.randint(0, 255, (2 * (n // 2),), dtype=torch.uint8, generator=gen)
            t = t.view(2, n // 2).t()
        flat[f"t{i}"] = t
    return flat


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(SIZES, min_size=1, max_size=24),
    threads=st.integers(1, 4),
    inline_every=st.integers(0, 4),
    strided=st.booleans(),
)
def test_every_byte_lands_and_pieces_pass_in_slot_order_once_in_place(
    sizes: list[int], threads: int, inline_every: int, strided: bool
) -> None:
    flat = _state(sizes, strided)
    entries, tensors, _ = plan(flat)
    want = torch.zeros(data_len(entries), dtype=torch.uint8)
    inline: dict[int, bytes] = {}
    sources: list[torch.Tensor | None] = []
    for i, (entry, tensor) in enumerate(zip(entries, tensors, strict=True)):
        raw = tensor.contiguous().reshape(-1).view(torch.uint8)
        want[entry.offset : entry.offset + entry.nbytes] = raw
        if inline_every and i % inline_every == 0:
            inline[i], source = raw.numpy().tobytes(), None
        else:
            source = tensor
        sources.append(source)
    data = torch.zeros_like(want)
    pieces = plan_pieces(data, entries, inline, sources)
    ends: list[int] = []

    def passed(piece: Piece) -> None:  # everything up to this piece's end is in place
        assert torch.equal(data[: piece.end], want[: piece.end])
        assert not ends or piece.end >= ends[-1]
        ends.append(piece.end)

    copy_pieces(pieces, passed, threads)
    assert torch.equal(data, want)
    assert ends == [p.end for p in pieces]  # each reported once, in slot order
    assert sum(p.nbytes for p in pieces) == sum(e.nbytes for e in entries)
    assert ends[-1] == entries[-1].offset + entries[-1].nbytes


def test_a_slow_thread_copies_fewer_pieces_instead_of_holding_the_copy_up() -> None:
    """The first piece taken blocks its thread until every other piece is done: only a
    copy whose threads take the next piece whenever they are free gets there (one split
    into fixed halves would wait forever; here it would time out and fail)."""
    count, done, took = 12, threading.Event(), []
    copied = [0]
    lock = threading.Lock()

    def copy(index: int) -> None:
        took.append((index, threading.current_thread().name))
        if index == 0:
            assert done.wait(10), "the other thread never copied the rest"
            return
        with lock:
            copied[0] += 1
            if copied[0] == count - 1:
                done.set()

    pieces = [Piece(i + 1, 1, lambda i=i: copy(i)) for i in range(count)]
    copy_pieces(pieces, lambda piece: None, threads=2)
    slow = next(name for index, name in took if index == 0)
    assert sum(1 for _, name in took if name != slow) == count - 1


def test_a_failed_piece_stops_the_copy_after_every_thread_stopped() -> None:
    writes_after: list[int] = []
    failed_at: list[float] = []

    def copy(index: int) -> None:
        if index == 3:
            failed_at.append(time.monotonic())
            raise OSError("bad page")
        time.sleep(0.02)  # the others are mid-piece when piece 3 fails
        if failed_at:
            writes_after.append(index)

    pieces = [Piece(i + 1, 1, lambda i=i: copy(i)) for i in range(60)]
    returned = None
    with pytest.raises(OSError, match="bad page"):
        try:
            copy_pieces(pieces, lambda piece: None, threads=3)
        finally:
            returned = len(writes_after)
    time.sleep(0.1)
    assert len(writes_after) == returned  # nothing copied after copy_pieces gave up
    assert len(writes_after) <= 3  # at most the pieces already under way elsewhere


def test_an_error_where_pieces_are_reported_stops_the_helpers_too() -> None:
    copied: list[int] = []
    pieces = [
        Piece(i + 1, 1, lambda i=i: (time.sleep(0.001), copied.append(i))) for i in range(300)
    ]

    def passed(piece: Piece) -> None:
        if piece.end == 5:
            raise KeyboardInterrupt  # a BaseException: the copy must stop all the same

    with pytest.raises(KeyboardInterrupt):
        copy_pieces(pieces, passed, threads=3)
    after = len(copied)
    time.sleep(0.05)
    assert len(copied) == after < 300


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("short source", "other than"),
        ("past the slot", "past the slot"),
        ("no source", "no source"),
    ],
)
def test_a_wrong_index_fails_before_any_raw_copy(case: str, match: str) -> None:
    entries, tensors, _ = plan({"a": torch.ones(1000), "b": torch.ones(64)})
    data = torch.zeros(data_len(entries), dtype=torch.uint8)
    sources: list[torch.Tensor | None] = list(tensors)
    if case == "short source":
        sources[1] = torch.ones(63)
    elif case == "past the slot":
        data = data[: entries[1].offset + 10]
    else:
        sources[0] = None
    with pytest.raises(ValueError, match=match):
        plan_pieces(data, entries, {}, sources)
    assert not data.any()


@pytest.mark.parametrize("after", [0, 5, 20])
def test_once_narrowed_only_the_calling_thread_copies(after: int) -> None:
    """A flush came (`narrow()`): the helpers take no more pieces, leaving the disk writer
    a core, and the calling thread copies the rest; every piece still lands once."""
    took: list[tuple[int, str]] = []
    lock = threading.Lock()

    def copy(index: int) -> None:
        with lock:
            took.append((index, threading.current_thread().name))
        time.sleep(0.001)

    def narrow() -> bool:
        with lock:
            return len(took) >= after

    pieces = [Piece(i + 1, 1, lambda i=i: copy(i)) for i in range(40)]
    copy_pieces(pieces, lambda piece: None, threads=3, narrow=narrow)
    assert sorted(i for i, _ in took) == list(range(40))
    me = threading.current_thread().name
    helpers_after = [i for n, (i, name) in enumerate(took) if n >= after and name != me]
    assert len(helpers_after) <= 2  # at most one piece each helper took before it saw


@settings(max_examples=30, deadline=None)
@given(
    saves=st.lists(
        st.tuples(
            st.integers(0, 1),  # the slot
            st.sampled_from(["same", "values", "new sources", "inline", "resized"]),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_a_remembered_plan_copies_what_a_fresh_one_does(saves: list[tuple[int, str]]) -> None:
    """Over saves into two slots where the values change in place, the sources are sent
    anew, another tensor travels inline, or a tensor changes size: every copy through the
    planner leaves the slot as a fresh plan's copy would (every byte of this save)."""
    planner = PiecePlanner()
    sizes = [3000, (1 << 20) + 5, 17, PIECE_BYTES + 3]
    flat = _state(sizes, strided=False)
    sources: list[torch.Tensor | None] = list(flat.values())
    inline_index = 2
    slots = [torch.zeros(data_len(plan(flat)[0]) + 8192, dtype=torch.uint8) for _ in range(2)]
    shown: list[torch.Tensor | None] = []  # the persister's list: replaced whole, or kept
    for step, (slot, change) in enumerate(saves):
        if change == "values":
            for tensor in flat.values():
                tensor.add_(step + 1)
        elif change == "new sources":
            sources = [t.clone() for t in flat.values()]
            flat = dict(zip(flat, sources, strict=True))
        elif change == "inline":
            inline_index = (inline_index + 1) % len(sizes)
        elif change == "resized":
            sizes[0] += 4096
            flat = _state(sizes, strided=False)
            sources = list(flat.values())
            slots = [torch.zeros(data_len(plan(flat)[0]) + 8192, dtype=torch.uint8)] * 2
        entries, tensors, _ = plan(flat)
        inline = {inline_index: tensors[inline_index].numpy().tobytes()}
        if change != "same" and change != "values" or not shown:
            shown = [None if i in inline else s for i, s in enumerate(sources)]
        data = slots[slot][: data_len(entries)]
        data.zero_()
        pieces = planner.plan(data, entries, inline, shown)
        fresh = plan_pieces(data, entries, inline, shown)
        assert [(p.end, p.nbytes) for p in pieces] == [(p.end, p.nbytes) for p in fresh]
        copy_pieces(pieces, lambda piece: None, 2)
        for entry, tensor in zip(entries, tensors, strict=True):
            raw = tensor.reshape(-1).view(torch.uint8)
            assert torch.equal(data[entry.offset : entry.offset + entry.nbytes], raw), entry.fqn


def test_a_plan_is_remembered_while_nothing_it_reads_changed() -> None:
    flat = _state([3000, 1 << 20, 17], strided=False)
    entries, tensors, _ = plan(flat)
    sources: list[torch.Tensor | None] = [tensors[0], tensors[1], None]
    data = torch.zeros(data_len(entries), dtype=torch.uint8)
    planner = PiecePlanner()
    first = planner.plan(data, entries, {2: b"a" * 17}, sources)
    again = planner.plan(data, list(entries), {2: b"b" * 17}, sources)
    assert again[0] is first[0] and again[-1] is not first[-1]  # inline: this save's bytes
    other = planner.plan(data, entries, {2: b"c" * 17}, list(sources))  # sources sent anew
    assert other[0] is not first[0]
    sources[2] = tensors[2]  # a source for every tensor, the first one travelling inline
    planner.plan(data, entries, {}, sources)
    now = planner.plan(data, entries, {0: bytes(3000)}, sources)
    copy_pieces(now, lambda piece: None, 1)
    assert not data[:3000].any()  # this save's inline bytes, not the source's
