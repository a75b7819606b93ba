"""The device book: which attempt holds which device index, over any sequence of takes,
ends, loans and take-backs; and the visible-devices values it turns into."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from argosy.core.visibility import entries, narrowed
from argosy.executors.device_book import DeviceBook, DevicesBusyError

HOLDERS = ("j1", "j2", "j3", "s.r0", "s.r1")


class BookMachine(RuleBasedStateMachine):
    """A model of what each holder asked for beside the book; the invariants are the
    book's contract."""

    @initialize(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=3))
    def nodes(self, sizes: list[int]) -> None:
        self.sizes = {f"n{i}": k for i, k in enumerate(sizes)}
        # indices as a server narrowed to some devices numbers them: not always 0..k-1
        self.book = DeviceBook({n: list(range(10, 10 + k)) for n, k in self.sizes.items()})
        self.asked: dict[str, dict[str, int]] = {}
        self.lent: set[str] = set()

    @rule(holder=st.sampled_from(HOLDERS), data=st.data())
    def take(self, holder: str, data: st.DataObject) -> None:
        wanted = {
            n: data.draw(st.integers(0, self.sizes[n] + 1), label=n)
            for n in data.draw(st.sets(st.sampled_from(sorted(self.sizes)), min_size=1))
        }
        wanted["cpu-slots"] = 3  # a node the book does not know: nothing to hold there
        before = {h: self.book.held(h) for h in HOLDERS}
        try:
            held = self.book.take(holder, wanted)
        except DevicesBusyError as err:
            assert "free" in str(err)
            assert {h: self.book.held(h) for h in HOLDERS} == before  # nothing changed
            others = self._held_by_others(holder)
            assert any(
                k > self.sizes[n] - len(others.get(n, set()))
                for n, k in wanted.items()
                if n in self.sizes
            )
            return
        assert "cpu-slots" not in held
        others = self._held_by_others(holder)
        for n, v in held.items():
            assert not set(v) & others.get(n, set())
        self.asked[holder] = {n: k for n, k in wanted.items() if n in self.sizes and k}
        self.lent.discard(holder)

    @rule(holder=st.sampled_from(HOLDERS))
    def release(self, holder: str) -> None:
        self.book.release(holder)
        self.asked.pop(holder, None)
        self.lent.discard(holder)

    @rule(holder=st.sampled_from(HOLDERS))
    def lend(self, holder: str) -> None:
        self.book.lend(holder)
        if holder in self.asked:
            self.lent.add(holder)

    @rule(holder=st.sampled_from(HOLDERS))
    def take_back(self, holder: str) -> None:
        mine = self.book.held(holder)
        others = self._held_by_others(holder)
        got = self.book.take_back(holder)
        if holder not in self.asked:
            assert not got
            return
        clash = any(set(v) & others.get(n, set()) for n, v in mine.items())
        assert got == (not clash or holder not in self.lent)
        if got:
            self.lent.discard(holder)

    def _held_by_others(self, holder: str) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for h in self.asked:
            if h != holder and h not in self.lent:
                for n, v in self.book.held(h).items():
                    out.setdefault(n, set()).update(v)
        return out

    @invariant()
    def no_device_held_twice(self) -> None:
        for node in self.sizes:
            seen: list[int] = []
            for h in self.asked:
                if h not in self.lent:
                    seen += self.book.held(h).get(node, ())
            assert len(seen) == len(set(seen)), (node, seen)

    @invariant()
    def each_holds_what_it_asked(self) -> None:
        for h in HOLDERS:
            held = self.book.held(h)
            asked = self.asked.get(h, {})
            assert {n: len(v) for n, v in held.items() if v} == asked
            for n, v in held.items():
                assert set(v) <= set(range(10, 10 + self.sizes[n]))

    @invariant()
    def free_is_what_no_attempt_holds(self) -> None:
        for node, k in self.sizes.items():
            taken = {
                i for h in self.asked if h not in self.lent for i in self.book.held(h).get(node, ())
            }
            free = self.book.free(node)
            assert set(free) == set(range(10, 10 + k)) - taken
            lent = {i for h in self.lent for i in self.book.held(h).get(node, ())}
            # devices nobody holds come before devices only lenders hold
            ranks = [i in lent for i in free]
            assert ranks == sorted(ranks)


TestBookMachine = BookMachine.TestCase
TestBookMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_two_attempts_on_one_host_get_disjoint_devices() -> None:
    book = DeviceBook({"gpu": list(range(8))})
    assert book.take("j1", {"gpu": 4}) == {"gpu": (0, 1, 2, 3)}
    assert book.take("j2", {"gpu": 4}) == {"gpu": (4, 5, 6, 7)}
    with pytest.raises(
        DevicesBusyError, match=r"1 device\(s\) of gpu asked for, 0 free \(held by j1, j2\)"
    ):
        book.take("j3", {"gpu": 1})
    book.release("j1")
    assert book.take("j3", {"gpu": 2}) == {"gpu": (0, 1)}


def test_a_lent_device_goes_last_and_comes_back_only_when_free() -> None:
    book = DeviceBook({"gpu": [0, 1, 2]})
    book.take("s.r0", {"gpu": 1})
    book.lend("s.r0")
    assert book.free("gpu") == [1, 2, 0]
    book.take("j1", {"gpu": 2})  # the unlent ones first
    assert book.take_back("s.r0")
    book.lend("s.r0")
    book.release("j1")
    book.take("j2", {"gpu": 3})  # now it needs the lent one too
    assert not book.take_back("s.r0")
    book.release("j2")
    assert book.take_back("s.r0")


@given(
    visible=st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True),
    data=st.data(),
)
def test_narrowing_names_the_parents_devices(visible: list[int], data: st.DataObject) -> None:
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, visible))}
    pick = data.draw(st.lists(st.integers(0, len(visible) - 1), min_size=1, unique=True))
    value = narrowed("CUDA_VISIBLE_DEVICES", pick, env)
    assert entries(value) == [str(visible[i]) for i in pick]
    assert narrowed("CUDA_VISIBLE_DEVICES", pick, {}) == ",".join(map(str, pick))
    with pytest.raises(ValueError, match="not all among"):
        narrowed("CUDA_VISIBLE_DEVICES", [len(visible)], env)


def test_entries_stop_where_the_runtime_stops() -> None:
    assert entries(None) is None
    assert entries("") == []
    assert entries("2, 3,-1,4") == ["2", "3"]
    assert entries("GPU-aa,GPU-bb") == ["GPU-aa", "GPU-bb"]
