"""An elastic job starts at the largest size the free devices allow (at least its
minimum) before anything is preempted for it; room is made for it only when not even
its minimum fits in free devices, and then for its minimum only."""

import pytest
from sched_helpers import check_invariants, job, make

LONG_AGO_S = 3600.0  # past `min_runtime_s`: the fixed job may be evicted


def _beside_fixed(fixed_devices: int, low: int, high: int, priority: int, queue: str = "a"):
    """One 8-device node, a fixed job of `fixed_devices` of `queue` running long enough to
    be a victim, then an elastic job `low..high` of `priority` in queue a (whose nominal
    share is the node): the next cycle's decisions."""
    sched, clock = make("h100:8", a_nominal=8)
    sched.submit(job("fixed", queue=queue, devices=fixed_devices))
    assert [d.action for d in sched.cycle()] == ["start"]
    clock.advance(LONG_AGO_S)
    sched.submit(job("el", devices=low, max_devices=high, priority=priority, submit=LONG_AGO_S))
    out = [(d.action, d.workload.id, d.after) for d in sched.cycle()]
    check_invariants(sched)
    return sched, out


@pytest.mark.parametrize("priority", [0, 1], ids=["same-priority", "higher-priority"])
@pytest.mark.parametrize(
    ("fixed", "low", "want"),
    [(4, 2, 4), (5, 2, 3), (6, 2, 2)],
    ids=["half-free", "three-free", "min-free"],
)
def test_elastic_job_starts_on_the_free_part_of_a_node_and_evicts_nothing(
    fixed, low, want, priority
):
    sched, out = _beside_fixed(fixed, low, 8, priority)
    assert out == [("start", "el", want)]
    assert sched.running["fixed"].alloc.devices == fixed


def test_room_is_made_for_the_minimum_only_when_it_does_not_fit_free():
    """7 of 8 devices held by queue b's borrower: the elastic job's minimum (2) does not
    fit. Queue a takes back its share, room for 2, not 8."""
    _, out = _beside_fixed(7, 2, 8, priority=0, queue="b")
    assert out == [("preempt", "fixed", 0), ("start", "el", 2)]


def test_a_borrower_beside_the_free_minimum_is_not_evicted():
    sched, out = _beside_fixed(4, 2, 8, priority=0, queue="b")
    assert out == [("start", "el", 4)]
    assert "fixed" in sched.running
