"""Invariants under random operation sequences (hypothesis):

- no device is allocated twice, and the free-capacity index stays exact;
- gangs are never partially placed (min <= devices <= max for every running job), and a
  gang with a per-node shape holds exactly that many devices on each of its nodes;
- usage never exceeds an explicit queue ceiling;
- after every cycle each group holds its hot spares (at least one) while a whole node is idle;
- a guarantee is always reclaimable within one cycle once its nodes are up.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_helpers import check_invariants, job, make, service

from argosy.scheduler import recovery
from argosy.scheduler.invariants import spares_short

NODES = 24  # h100:192 -> 24 nodes of 8

op = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(["a", "b"]), st.sampled_from([1, 2, 4, 8, 16, 32]),
              st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("shaped"), st.sampled_from(["a", "b"]), st.sampled_from([1, 2, 4]),
              st.integers(1, 4), st.integers(0, 3)),
    st.tuples(st.just("complete"), st.integers(0, 1000)),
    st.tuples(st.just("fail"), st.integers(0, NODES - 1), st.booleans()),
    st.tuples(st.just("repair"), st.integers(0, NODES - 1)),
    st.tuples(st.just("load"), st.sampled_from([0.0, 0.25, 1.0])),
    st.tuples(st.just("wait"), st.sampled_from([60.0, 1800.0, 7200.0])),
)  # fmt: skip


def apply(sched, clock, svc, step, counter):
    kind = step[0]
    if kind == "submit":
        _, queue, n, elastic, prio = step
        counter[0] += 1
        top = min(4 * n, 64) if elastic and n >= 8 else n
        sched.submit(job(f"j{counter[0]}", queue=queue, devices=n, max_devices=top,
                         priority=prio, submit=clock.now_s()))  # fmt: skip
    elif kind == "shaped":  # exactly per_node devices on each of `nodes` nodes
        _, queue, per_node, nodes, prio = step
        counter[0] += 1
        w = job(f"j{counter[0]}", queue=queue, devices=per_node * nodes, priority=prio,
                submit=clock.now_s())  # fmt: skip
        w.per_node = per_node
        sched.submit(w)
    elif kind == "complete" and sched.running:
        victims = sorted(sched.running)
        sched.complete(sched.running[victims[step[1] % len(victims)]])
    elif kind == "fail":
        recovery.node_failed(sched, step[1], clock.now_s(), hardware=step[2])
    elif kind == "repair":
        recovery.release_quarantine(sched, step[1])
    elif kind == "load":
        svc.profile[:] = step[1]
        sched.forecast_changed()
    else:
        clock.advance(step[1])
    sched.cycle()


@pytest.mark.parametrize("policy", ["quota", "argosy"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(op, min_size=5, max_size=40))
def test_invariants_hold_under_any_sequence(policy, steps):
    sched, clock = make("h100:192", policy=policy, guarantee=48, a_nominal=72, a_ceiling=120)
    svc = service("svc", peak=48, profile=[1.0])
    svc.profile_step_s = 1e9
    sched.submit(svc)
    counter = [0]
    for step in steps:
        apply(sched, clock, svc, step, counter)  # ends with a cycle
        check_invariants(sched)
        assert spares_short(sched) == []
    for node in range(NODES):  # bring every node back, then ask for the whole guarantee
        recovery.release_quarantine(sched, node)
    svc.profile[:] = 1.0
    sched.forecast_changed()
    sched.cycle()
    check_invariants(sched)
    assert svc.devices == 48, "guarantee not reclaimed within one cycle"
