"""The resume decision over simulated ranks: one step for all, whatever each rank holds.

Each rank runs `agree.resume` in its own thread; the collective is a barrier that hands
every rank every rank's value, as all_gather_object does.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint import agree


class FakeGroup:
    """all_gather over threads: every call is a rendezvous of all ranks."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.values: list = [None] * world
        self.barrier = threading.Barrier(world)

    def gather(self, rank: int, value: object) -> list:
        self.values[rank] = value
        self.barrier.wait()
        out = list(self.values)
        self.barrier.wait()
        return out


def run_ranks(world, memory, disk, bad, fatal=frozenset(), vanished=frozenset()):
    """Every rank's Decision (or exception); `bad` = {(rank, step, tier)} reads that fail."""
    group = FakeGroup(world)
    out: list = [None] * world

    def rank_main(rank: int) -> None:
        def read(step: int, from_memory: bool) -> str:
            tier = "memory" if from_memory else "disk"
            if (rank, step, tier) in fatal:
                raise ValueError("state mismatch")
            if (rank, step, tier) in vanished:
                raise FileNotFoundError(f"/dev/shm/slot-of-{step}")
            if (rank, step, tier) in bad:
                raise agree.UnreadableError(f"torn {tier} {step}")
            return f"{tier}:{step}"

        try:
            out[rank] = agree.resume(
                memory[rank], disk[rank], None, read, world, gather=lambda v: group.gather(rank, v)
            )
        except Exception as err:  # collected: every rank must fail alike
            out[rank] = err

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return out


def want_step(world, memory, disk, bad):
    """The newest (step, tier) every rank holds and can read; memory first at equal steps."""
    options = []
    for step in set.union(set(), *memory, *disk):
        for tier, held in (("memory", memory), ("disk", disk)):
            if all(step in held[r] and (r, step, tier) not in bad for r in range(world)):
                options.append((step, tier == "memory"))
    return max(options, default=None)


steps = st.sets(st.integers(0, 8), max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 3),
    data=st.data(),
)
def test_every_rank_resumes_at_the_same_newest_readable_step(world, data):
    memory = [data.draw(steps) for _ in range(world)]
    disk = [data.draw(steps) for _ in range(world)]
    bad = data.draw(
        st.sets(
            st.tuples(
                st.integers(0, world - 1), st.integers(0, 8), st.sampled_from(["memory", "disk"])
            )
        )
    )
    decisions = run_ranks(world, memory, disk, bad)
    assert all(isinstance(d, agree.Decision) for d in decisions), decisions
    chosen = {(d.step, d.source) for d in decisions}
    assert len(chosen) == 1  # one decision for all
    want = want_step(world, memory, disk, bad)
    step, source = chosen.pop()
    if want is None:
        assert step is None
    else:
        assert (step, source == "memory") == want
        assert all(d.result == f"{source}:{step}" for d in decisions)
    assert all(d.record()["ranks"] == decisions[0].record()["ranks"] for d in decisions)


def test_a_failure_that_is_not_a_torn_checkpoint_is_raised_on_every_rank():
    memory, disk = [{5}, {5}], [set(), set()]
    out = run_ranks(2, memory, disk, bad=set(), fatal={(1, 5, "memory")})
    assert isinstance(out[1], ValueError)  # the rank that failed: its own error
    assert isinstance(out[0], agree.AgreedError) and "rank 1" in str(out[0])


def test_a_torn_step_on_one_rank_sends_every_rank_to_the_previous_one():
    memory, disk = [set(), set()], [{10, 20}, {10, 20}]
    out = run_ranks(2, memory, disk, bad={(1, 20, "disk")})
    assert [d.step for d in out] == [10, 10]
    assert out[0].rejected == [{"step": 20, "source": "disk", "problems": {1: "torn disk 20"}}]


def test_a_memory_slot_that_vanished_on_one_rank_falls_back_to_the_commit_for_all():
    memory, disk = [{30}, {30}], [{20}, {20}]
    out = run_ranks(2, memory, disk, bad=set(), vanished={(1, 30, "memory")})
    assert [(d.step, d.source) for d in out] == [(20, "disk"), (20, "disk")]
    assert out[0].rejected[0]["source"] == "memory" and 1 in out[0].rejected[0]["problems"]


def test_a_file_of_a_committed_step_that_vanished_is_raised_on_every_rank():
    memory, disk = [set(), set()], [{20}, {20}]
    out = run_ranks(2, memory, disk, bad=set(), vanished={(0, 20, "disk")})
    assert isinstance(out[0], FileNotFoundError)
    assert isinstance(out[1], agree.AgreedError) and "rank 0" in str(out[1])


@pytest.mark.parametrize("world", [1, 2])
def test_nothing_held_is_a_fresh_start_for_all(world):
    out = run_ranks(world, [set()] * world, [set()] * world, bad=set())
    assert [d.step for d in out] == [None] * world
