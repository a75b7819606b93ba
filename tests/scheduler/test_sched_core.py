"""Admission, rejection, preemption, elasticity, tidal inference and fault handling."""

import pytest
from sched_helpers import check_invariants, job, make, service, settle

from argosy.scheduler import growth, recovery


@pytest.mark.parametrize(
    ("workload", "needle"),
    [
        (job("big", devices=512), "needs 512 devices"),
        (job("nochip", chips=("h200",)), "the cluster has ['h100-sxm']"),
        (job("typo", chips=("h1000",)), "unknown chip 'h1000'"),
        (job("noq", queue="nope"), "unknown leaf queue 'nope'"),
        (
            job("parent", queue="org"),
            "'org' is a parent queue; jobs and tokens name a leaf queue under it: a, b, svc",
        ),
    ],
    ids=["more-than-exist", "chip-nobody-has", "unknown-chip", "unknown-queue", "parent-queue"],
)
def test_never_fitting_workloads_are_rejected_at_submission(workload, needle):
    sched, _ = make()
    decision = sched.submit(workload)
    assert decision is not None and decision.action == "reject"
    assert needle in decision.reason and workload.reject_reason == decision.reason
    assert sched.pending == []


def test_gangs_start_whole_or_not_at_all_and_small_jobs_backfill():
    sched, _ = make("h100:64", policy="quota", a_nominal=64)
    sched.submit(job("a1", devices=40))
    sched.submit(job("a2", devices=32))  # cannot fit next to a1: must not start partially
    sched.submit(job("a3", devices=8))  # backfills past the blocked a2
    started = {d.workload.id: d.after for d in settle(sched) if d.action == "start"}
    assert started == {"a1": 40, "a3": 8}
    assert [w.id for w in sched.pending] == ["a2"]
    check_invariants(sched)


def test_kueue_like_quota_offers_one_head_per_queue_per_cycle():
    sched, _ = make("h100:64", policy="quota", a_nominal=32)
    for i in range(3):
        sched.submit(job(f"a{i}", queue="a", devices=1))
    sched.submit(job("b0", queue="b", devices=1))
    assert sorted(d.workload.id for d in sched.cycle()) == ["a0", "b0"]
    argosy, _ = make("h100:64", policy="argosy", a_nominal=32)
    for i in range(3):
        argosy.submit(job(f"a{i}", queue="a", devices=1))
    assert len(argosy.cycle()) == 3


def test_fifo_is_strict_the_head_blocks():
    sched, _ = make("h100:64", policy="fifo")
    for wid, n in (("f1", 40), ("f2", 32), ("f3", 8)):
        sched.submit(job(wid, devices=n))
    assert [d.workload.id for d in sched.cycle()] == ["f1"]


def test_heterogeneous_job_takes_the_faster_chip():
    sched, _ = make("a100-80g:64+h100:64", policy="quota", chip="h100")
    w = job("het", devices=16, chips=("a100-80g", "h100"))
    sched.submit(w)
    sched.cycle()
    assert w.chip == "h100-sxm"


def reclaim_setup(policy="quota"):
    """Queue b borrows the whole cluster; then queue a (nominal 32) wants its share."""
    sched, clock = make("h100:64", policy=policy, a_nominal=32)
    for i in range(4):
        sched.submit(job(f"b{i}", queue="b", devices=16))
    settle(sched)
    assert sum(w.borrowed for w in sched.running.values()) == 32
    return sched, clock


def test_preemption_reclaims_borrowed_quota_with_whole_gangs_and_deterministic_victims():
    runs = []
    for _ in range(2):
        sched, clock = reclaim_setup()
        clock.advance(sched.config.min_runtime_s)
        sched.submit(job("a-big", queue="a", devices=32))
        decisions = settle(sched)
        runs.append([(d.action, d.workload.id, d.after) for d in decisions])
        check_invariants(sched)
    assert runs[0] == runs[1]  # same state, same victims
    evicted = [d for d in runs[0] if d[0] == "preempt"]
    assert len(evicted) == 2 and all(after == 0 for _, _, after in evicted)
    assert ("start", "a-big", 32) in runs[0]


def test_no_preemption_before_min_runtime_or_when_it_would_not_make_room():
    sched, clock = reclaim_setup()
    sched.submit(job("a-big", queue="a", devices=32))
    assert sched.cycle() == []  # victims too young: nothing happens
    clock.advance(sched.config.min_runtime_s)
    sched.submit(job("a-huge", queue="a", devices=128, max_devices=128))
    before = {w.id: w.alloc.nodes.tolist() for w in sched.running.values()}
    # a-huge can never fit (rejected); a-big still can and does
    assert {d.workload.id for d in settle(sched) if d.action == "start"} == {"a-big"}
    assert all(w.id in before for w in sched.running.values() if w.id != "a-big")


def test_preemption_cap_protects_a_job_evicted_too_often():
    sched, clock = reclaim_setup()
    for w in sched.running.values():
        w.preemptions = sched.config.max_preemptions_per_job
    clock.advance(sched.config.min_runtime_s)
    sched.submit(job("a-big", queue="a", devices=32))
    assert [d for d in settle(sched) if d.action == "preempt"] == []


def test_elastic_job_shrinks_instead_of_being_evicted_and_grows_back():
    sched, clock = make("h100:128", policy="argosy", a_nominal=64)
    big = job("el", queue="b", devices=32, max_devices=128)
    big.state_bytes = 405e9 * 16  # a 405B model's state: each resize stalls about 35 s
    sched.submit(big)
    sched.cycle()
    assert big.devices == 120  # grows to all whole nodes but the buffer (1 device: a node)
    sched.submit(job("a1", queue="a", devices=32, priority=5))  # training, within nominal
    decisions = sched.cycle()
    assert [d.action for d in decisions] == ["resize", "start"]
    assert 32 <= big.devices < 120 and not any(d.action == "preempt" for d in decisions)
    check_invariants(sched)
    sched.complete(next(w for w in sched.running.values() if w.id == "a1"))
    clock.advance(sched.config.min_resize_interval_s)
    sched.cycle()
    assert big.devices == 80  # one more resize is not yet within the job's stall budget
    clock.advance(3 * 3600.0)  # 1% of three hours of running covers it
    sched.cycle()
    assert sched.spares == [1]  # 16 nodes hold one hot spare from the first cycle on
    assert big.devices == 120 - 8  # every whole node but the buffer and the spare


def test_guarantee_is_reclaimed_from_lent_capacity_within_one_cycle():
    sched, clock = make("h100:128", policy="argosy", guarantee=64, a_nominal=32)
    svc = service("svc", peak=64, profile=[0.1, 1.0])  # trough, then peak
    sched.submit(svc)
    sched.submit(job("el", queue="b", devices=16, max_devices=128))
    sched.cycle()
    assert svc.devices == 64  # the forecast already sees the peak coming
    clock.set(3 * 86400)  # far from any step boundary effects: reset the forecast
    svc.profile_step_s = 86400.0 * 10
    svc.profile[:] = 0.1
    sched.forecast_changed()
    sched.cycle()
    clock.advance(sched.config.min_resize_interval_s)
    sched.cycle()
    lent = next(w for w in sched.running.values() if w.id == "el")
    assert svc.devices < 10 and lent.lent > 0  # idle guarantee lent to elastic training
    svc.profile[:] = 1.0
    sched.forecast_changed()
    sched.cycle()
    assert svc.devices == 64  # back within one cycle, by shrinking the borrower
    check_invariants(sched)


def test_hot_spare_replaces_a_failed_gang_member_and_lemons_are_quarantined():
    sched, clock = make("h100:1600", policy="argosy", a_nominal=800)
    gang = job("g", queue="a", devices=64)
    sched.submit(gang)
    sched.cycle()
    assert sched.spares == [sched.spare_target(0)] and sched.spares[0] >= 1
    node = int(gang.alloc.nodes[0])
    decisions = recovery.node_failed(sched, node, clock.now_s(), hardware=True)
    assert [(d.action, d.after) for d in decisions] == [("restart", 64)]
    assert node not in gang.alloc.nodes and not sched.cap.up[node]
    check_invariants(sched)
    assert recovery.node_repaired(sched, node)
    recovery.node_failed(sched, node, clock.now_s() + 10, hardware=True)
    assert node in sched.quarantined and not recovery.node_repaired(sched, node)
    check_invariants(sched)


def test_without_spares_a_hit_gang_is_requeued_and_transient_faults_restart_in_place():
    sched, clock = make("h100:64", policy="quota")
    gang = job("g", devices=32)
    sched.submit(gang)
    sched.cycle()
    node = int(gang.alloc.nodes[0])
    soft = recovery.node_failed(sched, node, 0.0, hardware=False)
    assert [(d.action, d.after) for d in soft] == [("restart", 32)]
    hard = recovery.node_failed(sched, node, 0.0, hardware=True)
    assert [(d.action, d.after) for d in hard] == [("requeue", 0)]
    assert gang in sched.pending and gang.alloc is None
    check_invariants(sched)


def test_fifo_head_blocks_only_its_own_chip_pool():
    sched, _ = make("a100-80g:64+h100:64", policy="fifo", chip="h100")
    sched.submit(job("h-big", devices=64, chips=("h100",)))
    sched.submit(job("h-blocked", devices=64, chips=("h100",)))
    sched.submit(job("h-small", devices=8, chips=("h100",)))
    sched.submit(job("a-ok", devices=8, chips=("a100-80g",)))
    assert [d.workload.id for d in sched.cycle()] == ["h-big", "a-ok"]


@pytest.mark.parametrize(
    ("policy", "guarantee", "peak", "want_rejected", "want_ok"),
    [("fifo", 0, 32, 40, 32), ("quota", 48, 8, 24, 16), ("argosy", 48, 48, 24, 16)],
    ids=["fifo-peak-replicas", "quota-guarantee", "argosy-guarantee"],
)
def test_gangs_that_never_fit_beside_pinned_reservations_are_rejected(
    policy, guarantee, peak, want_rejected, want_ok
):
    sched, _ = make("h100:64", policy=policy, guarantee=guarantee, a_nominal=8)
    sched.submit(service("svc", peak=peak))
    too_big = sched.submit(job("big", devices=want_rejected))
    assert too_big is not None and "beside pinned reservations" in too_big.reason
    assert sched.submit(job("ok", devices=want_ok)) is None
    assert [w.id for w in sched.pending] == ["ok"]


def test_evaluation_waits_until_shrinking_for_it_pays():
    sched, clock = make("h100:128", policy="argosy", a_nominal=64)
    big = job("el", queue="b", devices=32, max_devices=128)
    sched.submit(big)
    sched.cycle()
    clock.advance(3600.0)
    ev = job("ev", queue="a", devices=32, priority=5, kind="eval", submit=clock.now_s())
    sched.submit(ev)
    assert sched.cycle() == []  # a resize stall of the ~90 devices kept > ev's wait so far
    stall = growth.resize_cost(sched, big, big.devices, 96) * 96  # the shrink, device-seconds
    clock.advance(stall / 32 + 300.0)  # ev has now waited longer than that, per device
    assert [d.action for d in sched.cycle()] == ["resize", "start"]
    check_invariants(sched)
