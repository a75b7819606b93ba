"""Backfill with reservations and lent guarantees (`argosy.scheduler.backfill`).

With exact estimates (margin 1) EASY backfill keeps its promise: a workload that got a
reservation starts no later than the start it was first promised, whatever the mix of
gangs behind it; a gang runs on a service's idle guarantee only when it ends before the
service's forecast needs the devices back, and then the service gets them back without
evicting anyone. Without an estimator neither happens.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import check_invariants, job, service, tree_for

from argosy.core.clock import FakeClock
from argosy.hardware.loader import load_cluster
from argosy.scheduler import elastic
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.core import Scheduler
from argosy.scheduler.policies import policies


class ExactEstimator:
    """Run times known exactly: `runs[id]` seconds from a workload's start."""

    def __init__(self, runs: dict[str, float]) -> None:
        self.runs = runs

    def run_s(self, w, chip, devices):
        return self.runs.get(w.id)


def make(spec: str, runs: dict[str, float] | None, **tree_kw) -> tuple[Scheduler, FakeClock]:
    cluster = load_cluster(spec)
    clock = FakeClock()
    config = SchedulerConfig(backfill_margin=1.0)
    tree = tree_for(cluster, **tree_kw)
    sched = Scheduler(cluster, tree, policies.get("argosy"), config, clock)
    if runs is not None:
        sched.estimator = ExactEstimator(runs)
    sched.cycle()  # hot spares are held before any work arrives
    return sched, clock


def usable(sched: Scheduler) -> int:
    return int(sched.cap.free_devices[0])


def test_a_short_job_backfills_ahead_of_the_reservation_and_a_long_one_waits():
    runs = {"r1": 1000.0, "r2": 3000.0, "head": 500.0, "short": 900.0, "long": 5000.0}
    sched, clock = make("h100:128", runs, a_nominal=128)
    free = usable(sched)
    r1, r2 = job("r1", devices=64, submit=0), job("r2", devices=free - 64 - 32, submit=0)
    for w in (r1, r2):
        sched.submit(w)
    sched.cycle()
    assert usable(sched) == 32
    shapes = (("head", 96, 1), ("short", 16, 2), ("long", 16, 3))
    head, short, long_ = (job(n, devices=d, submit=t) for n, d, t in shapes)
    for w in (head, short, long_):
        sched.submit(w)
    sched.cycle()
    assert head.reserved_at_s == 1000.0  # r1's end frees 64 + the 32 free now
    assert short.alloc is not None and long_.alloc is None  # 900 s ends before; 5000 s not
    assert sched.backfill.backfilled == 1 and sched.backfill.refused >= 1
    clock.set(900.0)
    sched.complete(short)
    sched.cycle()
    assert long_.alloc is None  # 16 free, but the head's 96 are due at 1000
    clock.set(1000.0)
    sched.complete(r1)
    sched.cycle()
    assert head.alloc is not None and head.started_s == 1000.0
    assert sched.backfill.late_s == [0.0]
    check_invariants(sched)


def test_without_an_estimator_nothing_is_reserved_and_backfill_is_greedy():
    sched, clock = make("h100:128", None, a_nominal=128)
    free = usable(sched)
    sched.submit(job("r1", devices=64))
    sched.submit(job("r2", devices=free - 96))
    sched.cycle()
    head, long_ = job("head", devices=96, submit=1), job("long", devices=16, submit=2)
    sched.submit(head)
    sched.submit(long_)
    sched.cycle()
    assert head.reserved_at_s < 0 and long_.alloc is not None
    assert sched.backfill.reserved == 0


def _tidal(runs):
    """h100:128 with a 64-device guarantee for a service at a quarter of its peak for two
    hours, then at its peak; queue a fills what the guarantee leaves."""
    sched, clock = make("h100:128", runs, guarantee=64, a_nominal=64)
    svc = service("svc", 64, [0.25] * 12 + [1.0] * 132)
    sched.submit(svc)
    sched.cycle()
    assert svc.devices == 16
    filler = job("fill", queue="a", devices=usable(sched) - 48)
    sched.submit(filler)
    sched.cycle()
    assert filler.alloc is not None and usable(sched) == 48  # only the unused guarantee
    return sched, clock, svc


def test_a_gang_that_ends_before_the_peak_runs_on_the_idle_guarantee():
    sched, clock, svc = _tidal({"short": 1800.0, "long": 7200.0, "fill": 1e9})
    short, long_ = job("short", queue="b", devices=16, submit=1), job("long", "b", 16, submit=2)
    sched.submit(short)
    sched.submit(long_)
    sched.cycle()
    assert short.alloc is not None and short.lent == 16  # ends at 1800 s, the peak at 7200
    assert long_.alloc is None  # would still run when the service needs its devices
    assert sched.backfill.lent_starts == 1
    clock.set(1800.0)
    sched.complete(short)
    decisions = []
    for t in range(2400, 7201, 600):  # the forecast brings the replicas up before the peak
        clock.set(float(t))
        decisions += sched.cycle()
    assert svc.devices == 64
    assert not [d for d in decisions if d.action == "preempt"]
    check_invariants(sched)


def test_without_an_estimator_the_guarantee_is_never_lent():
    sched, clock, svc = _tidal(None)
    short = job("short", queue="b", devices=16, submit=1)
    sched.submit(short)
    sched.cycle()
    assert short.alloc is None and sched.backfill.lent_starts == 0


gangs = st.lists(
    st.tuples(st.sampled_from([8, 16, 32, 48, 64, 96]), st.integers(1, 50)),
    min_size=2,
    max_size=24,
)


@settings(max_examples=40, deadline=None)
@given(gangs)
def test_with_exact_estimates_every_reservation_is_kept(spec):
    """Whole-node gangs of random sizes and run times, queued at once: run them to the
    end, completing each at its estimated end. Every workload that was promised a start
    gets it no later than promised; the invariants hold after every cycle."""
    runs = {f"g{i}": 100.0 * r for i, (_, r) in enumerate(spec)}
    sched, clock = make("h100:128", runs, a_nominal=128)
    work = [job(f"g{i}", devices=d, submit=float(i)) for i, (d, _) in enumerate(spec)]
    for w in work:
        sched.submit(w)
    for _ in range(4 * len(work)):
        sched.cycle()
        check_invariants(sched)
        running = [w for w in work if w.alloc is not None]
        if not running:
            break
        ends = np.array([w.started_s + runs[w.id] for w in running])
        clock.set(float(ends.min()))
        for w, end in zip(running, ends, strict=True):
            if end <= clock.now_s():
                sched.complete(w)
    assert all(w.started_s >= 0 for w in work)
    for w in work:
        if w.reserved_at_s >= 0:
            assert w.started_s <= w.reserved_at_s + 1e-6, (w.id, w.started_s, w.reserved_at_s)


def test_a_service_without_a_forecast_lends_nothing_it_may_want():
    sched, clock = make("h100:128", {"short": 60.0, "fill": 1e9}, guarantee=64, a_nominal=64)
    svc = service("svc", 64)
    svc.profile = None  # no load profile: it may want its peak at any moment
    sched.submit(svc)
    sched.cycle()
    elastic._shrink_service(sched, svc, 63)  # below its peak for now (replicas restarting)
    svc.recount()
    fill = job("fill", queue="a", devices=usable(sched) - 63)
    sched.submit(fill)
    short = job("short", queue="b", devices=8, submit=1)
    sched.submit(short)
    sched.cycle()
    assert fill.alloc is not None and usable(sched) == 63  # only the unused guarantee
    assert short.alloc is None and sched.backfill.lent_starts == 0


def test_an_elastic_job_held_by_a_reservation_evicts_nobody_while_its_minimum_fits_free():
    """32 devices free, reserved with r1's 64 for the blocked head at 5000 s: an elastic
    job of higher priority whose minimum fits in them but whose run would cross the
    reservation waits; room-making does not evict a lower-priority job to start it."""
    runs = {"r1": 5000.0, "victim": 1e6, "r2": 1e6, "head": 1000.0, "el": 1e5}
    sched, clock = make("h100:128", runs, a_nominal=128)
    free = usable(sched)
    sizes = (("r1", 64), ("victim", 16), ("r2", free - 64 - 16 - 32))
    for name, n in sizes:
        sched.submit(job(name, devices=n))
    sched.cycle()
    assert usable(sched) == 32
    clock.set(2000.0)  # the victim has run past min_runtime_s
    sched.submit(job("head", devices=96, priority=1, submit=1999.0))
    el = job("el", devices=16, max_devices=32, priority=1, submit=2000.0)
    sched.submit(el)
    out = [(d.action, d.workload.id) for d in sched.cycle()]
    assert out == [] and el.alloc is None, out
    assert sched.reservations[0].workload.id == "head"
    check_invariants(sched)
