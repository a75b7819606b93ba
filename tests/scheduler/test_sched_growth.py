"""Growth that pays: past the nominal size only while the pool is idle, never when the
capacity is expected back too soon, never into what inference will need."""

import numpy as np
from sched_helpers import check_invariants, job, make, service

from argosy.core.clock import FakeClock
from argosy.hardware.loader import load_cluster
from argosy.scheduler.core import Scheduler
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree


def test_elastic_job_overgrows_only_while_nothing_pending_wants_its_chip():
    sched, clock = make("h100:512", policy="argosy", a_nominal=256)
    el = job("el", queue="b", devices=32, max_devices=128)
    sched.submit(el)
    sched.cycle()
    # nothing else waits for the pool: it starts above its nominal size (no resize stall)
    assert 128 < el.devices <= 128 * sched.config.elastic_overgrow
    assert el.grown_s == 0.0  # how long the overgrowth is held is learnt
    check_invariants(sched)
    other, other_clock = make("h100:512", policy="argosy", a_nominal=256)
    el2 = job("el", queue="b", devices=32, max_devices=128)
    other.submit(el2)
    other.submit(job("huge", queue="a", devices=400))  # pending: wants the pool
    other.cycle()
    assert el2.devices <= 128  # starts within its nominal size
    other_clock.advance(other.config.min_resize_interval_s)
    other.cycle()
    assert el2.devices <= 128
    check_invariants(other)


def test_no_growth_when_grown_capacity_comes_back_too_soon():
    sched, clock = make("h100:512", policy="argosy", a_nominal=256)
    sched.hold_s[0] = (60.0, 0.0)  # just observed: grown capacity came back within a minute
    el = job("el", queue="b", devices=32, max_devices=128)
    sched.submit(el)
    sched.cycle()
    before = el.devices
    clock.advance(sched.config.min_resize_interval_s)
    sched.cycle()
    assert el.devices == before  # 64 devices x 60 s do not pay two stalls of the job


def test_growth_leaves_what_the_services_will_need_soon():
    sched, clock = make("h100:256", policy="argosy", guarantee=128, a_nominal=64)
    svc = service("svc", peak=128, profile=[0.1] * 6 + [1.0] * 6)  # peak in an hour
    sched.submit(svc)
    el = job("el", queue="b", devices=16, max_devices=64)
    sched.submit(el)
    sched.cycle()
    clock.advance(sched.config.min_resize_interval_s)
    sched.cycle()
    free = int(sched.cap.free_devices.sum())
    assert free + svc.devices >= 128  # the peak fits without a shrink
    assert np.all(sched.cap.avail >= 0)
    check_invariants(sched)


def test_a_flexible_job_leaves_a_contested_pool_to_the_jobs_pinned_to_it():
    chips = {}
    cluster = load_cluster("a100-80g:64+h100:64")
    spec = {"queues": [{"name": "a", "quota": {"a100-80g": {"nominal": 64},
                                               "h100": {"nominal": 64}}}]}  # fmt: skip
    for policy in ("quota", "argosy"):
        tree = build_tree(QueuesFile.model_validate(spec), cluster)
        sched = Scheduler(cluster, tree, policies.get(policy), clock=FakeClock())
        sched.submit(job("fill", devices=32, chips=("h100",)))
        sched.cycle()
        sched.submit(job("pinned", devices=64, chips=("h100",), priority=9))  # waits
        flexible = job("flex", devices=8, chips=("a100-80g", "h100"))
        sched.submit(flexible)
        sched.cycle()
        chips[policy] = flexible.chip
        check_invariants(sched)
    assert chips == {"quota": "h100-sxm", "argosy": "a100-80g"}


def test_throughput_share_counts_a_fast_chip_for_more():
    sched, _ = make("a100-80g:64+h100:64", policy="argosy", chip="h100", a_nominal=64)
    tree = sched.tree
    tree.add("b", "a100-80g", 16)
    slow = tree.share("b", throughput=True)
    tree.add("b", "a100-80g", -16)
    tree.add("b", "h100-sxm", 16)
    fast = tree.share("b", throughput=True)
    assert fast > slow > 0
    assert tree.share("b") == tree.share("b", throughput=False)


def test_a_shrink_for_an_arrival_takes_the_job_that_stalls_least_per_device_freed():
    sched, clock = make("h100:256", policy="argosy", a_nominal=128)
    dear = job("dear", queue="b", devices=64, max_devices=128)
    dear.state_bytes = 405e9 * 16  # 50 GB a rank at 128 ranks: a slow snapshot
    cheap = job("cheap", queue="b", devices=32, max_devices=128)
    cheap.state_bytes = 8e9 * 16
    for w in (cheap, dear):
        sched.submit(w)
    sched.cycle()
    held = {w.id: w.devices for w in (dear, cheap)}
    assert held["cheap"] > held["dear"]  # the smallest job is not the cheapest to shrink
    clock.advance(sched.config.min_runtime_s)
    sched.submit(job("a1", queue="a", devices=64, priority=5))  # within a's nominal share
    decisions = sched.cycle()
    shrunk = {d.workload.id for d in decisions if d.action == "resize"}
    assert shrunk == {"cheap"}, (held, decisions)
    assert dear.devices == held["dear"]
    check_invariants(sched)
