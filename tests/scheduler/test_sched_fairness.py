"""One queue floods the cluster; another's job still gets the next freed device.

Both queues borrow (no nominal quota), so both have the same share whenever the flooding
queue's last running job ends: the queue that held the devices lately goes after the one
that did not (`QueueTree.past_share`, decayed device-seconds), whatever the submit order.
And the decayed use itself: the integral of what a queue held, halving every half-life.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import check_invariants, job, settle

from argosy.core.clock import FakeClock
from argosy.hardware.loader import load_cluster
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.core import Scheduler
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree

NO_QUOTA = {"queues": [{"name": "org", "children": [{"name": "a"}, {"name": "b"}]}]}


def _scheduler(nodes: int, policy: str = "argosy") -> tuple[Scheduler, FakeClock]:
    cluster = load_cluster(f"h100:{8 * nodes}")
    tree = build_tree(QueuesFile.model_validate(NO_QUOTA), cluster)
    clock = FakeClock()
    return Scheduler(cluster, tree, policies.get(policy), clock=clock), clock


@settings(max_examples=40, deadline=None)
@given(
    nodes=st.integers(1, 3),
    extra=st.integers(1, 6),
    held_s=st.floats(1.0, 7 * 86400.0),
    policy=st.sampled_from(["argosy", "quota"]),
    data=st.data(),
)
def test_a_flooding_queue_does_not_keep_every_freed_device(
    nodes: int, extra: int, held_s: float, policy: str, data: st.DataObject
) -> None:
    sched, clock = _scheduler(nodes, policy)
    flood = [job(f"a{i}", queue="a", devices=8) for i in range(nodes + extra)]
    for w in flood:
        sched.submit(w)
    settle(sched)
    running = sorted(sched.running)
    assert len(running) == nodes  # a holds the whole cluster; the rest of it waits
    clock.advance(held_s)
    victim = job("b0", queue="b", devices=8, submit=clock.now_s())
    sched.submit(victim)
    assert settle(sched) == []  # no room, and no reclaim: b has no quota either
    for _ in range(nodes):  # a's jobs end one by one, in any order
        done = data.draw(st.sampled_from(sorted(sched.running)))
        sched.complete(sched.running[done])
        clock.advance(1.0)
        settle(sched)
        check_invariants(sched)
        if victim.id in sched.running:
            break
    assert victim.id in sched.running, "queue a kept every freed device"


def test_decayed_use_is_the_integral_of_what_a_queue_held() -> None:
    """8 devices held for one half-life, then nothing for one: the integral of a
    decaying hold is 8 x H / ln 2 x (1 - 1/2), then halved."""
    config = SchedulerConfig(usage_half_life_s=3600.0)
    cluster = load_cluster("h100:8")
    tree = build_tree(QueuesFile.model_validate(NO_QUOTA), cluster)
    clock = FakeClock()
    sched = Scheduler(cluster, tree, policies.get("argosy"), config, clock)
    w = job("a0", queue="a", devices=8)
    sched.submit(w)
    settle(sched)
    clock.advance(3600.0)
    sched.complete(w)  # the change brings the decayed use up to date first
    held = 8 * 3600.0 / math.log(2) * 0.5
    assert tree.past_share("a") == pytest.approx(held)
    clock.advance(3600.0)
    tree.advance(clock.now_s())
    assert tree.past_share("a") == pytest.approx(held / 2)
    assert tree.past_share("b") == 0.0


def test_a_grown_cluster_keeps_who_held_it_lately() -> None:
    small, big = load_cluster("h100:8"), load_cluster("h100:16+910b:8")
    old = build_tree(QueuesFile.model_validate(NO_QUOTA), small)
    old.add("a", "h100-sxm", 8)
    old.advance(0.0)
    old.advance(600.0)
    new = build_tree(QueuesFile.model_validate(NO_QUOTA), big)
    new.inherit_use(old)
    assert new.past_share("a") == pytest.approx(old.past_share("a")) and new.past_share("a") > 0
    assert new.past_share("b") == 0.0
    new.advance(1200.0)  # from where the old one stopped: decayed, nothing added (no usage)
    assert new.past_share("a") < old.past_share("a")


@given(
    devices=st.integers(1, 64),
    start=st.floats(0.0, 5e5),
    length=st.floats(1.0, 5e5),
    after=st.floats(0.0, 5e5),
)
def test_past_use_rebuilt_from_a_record_equals_what_was_counted_live(
    devices: int, start: float, length: float, after: float
) -> None:
    """A restarted server rebuilds the decayed use from (start, end, devices) records;
    that gives what counting the hold as it happened gave."""
    cluster = load_cluster("h100:64")
    live = build_tree(QueuesFile.model_validate(NO_QUOTA), cluster)
    live.half_life_s = 3600.0
    live.advance(start)
    live.add("a", "h100-sxm", devices)
    live.advance(start + length)
    live.add("a", "h100-sxm", -devices)
    now = start + length + after
    live.advance(now)
    rebuilt = build_tree(QueuesFile.model_validate(NO_QUOTA), cluster)
    rebuilt.half_life_s = 3600.0
    rebuilt.add_past_use("a", "h100-sxm", devices, start, start + length, now)
    rebuilt.add_past_use("gone", "h100-sxm", devices, start, start + length, now)  # no queue
    assert rebuilt.past_share("a") == pytest.approx(live.past_share("a"), rel=1e-6, abs=1e-9)
    assert rebuilt.past_share("org") == pytest.approx(live.past_share("org"), rel=1e-6, abs=1e-9)
    assert rebuilt.past_share("b") == 0.0


@given(
    start=st.floats(-1e12, 1e12),
    length=st.floats(0.0, 1e12),
    now=st.floats(-1e12, 1e12),
)
def test_a_record_from_any_time_counts_only_its_part_before_now(
    start: float, length: float, now: float
) -> None:
    """Records come from a wall clock, which may have been stepped back since (or ahead):
    whatever their dates, a rebuild never fails, never counts a negative or unbounded
    use, and counts what lies after `now` as nothing."""
    cluster = load_cluster("h100:64")
    tree = build_tree(QueuesFile.model_validate(NO_QUOTA), cluster)
    tree.half_life_s = 3600.0
    tree.add_past_use("a", "h100-sxm", 8, start, start + length, now)
    share = tree.past_share("a")
    assert 0.0 <= share < float("inf")
    if start >= now:
        assert share == 0.0
