"""Growth that pays: past the nominal size only while the pool is idle, never when the
capacity is expected back too soon, never into what inference will need."""

import numpy as np
from sched_helpers import check_invariants, job, make, service


def test_elastic_job_overgrows_only_while_nothing_pending_wants_its_chip():
    sched, clock = make("h100:512", policy="argosy", a_nominal=256)
    el = job("el", queue="b", devices=32, max_devices=128)
    sched.submit(el)
    sched.cycle()
    assert el.devices == 128  # starts at its nominal size
    clock.advance(sched.config.min_resize_interval_s)
    sched.cycle()
    assert 128 < el.devices <= 128 * sched.config.elastic_overgrow
    check_invariants(sched)
    other, other_clock = make("h100:512", policy="argosy", a_nominal=256)
    el2 = job("el", queue="b", devices=32, max_devices=128)
    other.submit(el2)
    other.submit(job("huge", queue="a", devices=400))  # pending: wants the pool
    other.cycle()
    other_clock.advance(other.config.min_resize_interval_s)
    other.cycle()
    assert el2.devices <= 128


def test_no_growth_when_grown_capacity_comes_back_too_soon():
    sched, clock = make("h100:512", policy="argosy", a_nominal=256)
    sched.hold_s[0] = 60.0  # observed: grown capacity was taken back within a minute
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
