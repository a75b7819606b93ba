"""Growth into inference troughs (the policy flag `trough_growth`, off for argosy): an
elastic job borrows capacity a service will need only after the forecast lead when the
time until then pays for the resizes, and the service takes it back before its peak, in
one shrink per job (`batch_reclaim`, on for argosy)."""

from dataclasses import replace

from sched_helpers import check_invariants, job, make, service

PROFILE = [0.1] * 9 + [1.0] * 9  # ten-minute steps: the peak comes after 90 minutes


def _run(**flags):
    sched, clock = make("h100:256", policy="argosy", guarantee=200)
    sched.policy = replace(sched.policy, **{"trough_growth": True, **flags})
    svc = service("svc", peak=200, profile=PROFILE)
    sched.submit(svc)
    el = job("el", queue="b", devices=16, max_devices=128)
    sched.submit(el)
    sched.cycle()
    started = el.devices
    clock.advance(sched.config.min_resize_interval_s)
    sched.cycle()
    grown = el.devices
    check_invariants(sched)
    resizes = 0
    while clock.now_s() < 90 * 60:  # up to the peak: the service must be whole by then
        clock.advance(300.0)
        resizes += sum(d.action == "resize" and d.workload is el for d in sched.cycle())
        check_invariants(sched)
    return started, grown, svc.devices, resizes


def test_a_job_grows_into_a_trough_and_gives_it_back_in_one_shrink_before_the_peak():
    started, grown, replicas, resizes = _run()
    assert grown > started  # the trough was lent: it is needed only in 80 minutes
    assert replicas == 200  # the service is whole at its peak
    assert resizes == 1  # one shrink took the whole shortfall back


def test_without_trough_growth_the_forecast_within_the_hold_time_is_never_grown_into():
    started, grown, replicas, _ = _run(trough_growth=False)
    assert grown == started
    assert replicas == 200


def test_without_batching_a_reclaim_shrinks_a_node_at_a_time():
    _, grown, replicas, resizes = _run(batch_reclaim=False)
    assert replicas == 200
    assert resizes > 2  # one node per shrink, a stall each
