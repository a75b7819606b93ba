"""The growth pass under a backlog: pending demand larger than the free room is never
grown into, so the pass looks at no job at all (its cost no longer grows with the
number of elastic jobs while work waits), and it looks again once the backlog clears."""

from __future__ import annotations

from sched_helpers import check_invariants, job, make

from argosy.scheduler import elastic


def test_a_backlog_larger_than_the_free_room_skips_the_growth_walk(monkeypatch):
    looked: list[str] = []
    real = elastic._grow_one

    def counting(sched, w, *args, **kwargs):
        looked.append(w.id)
        return real(sched, w, *args, **kwargs)

    monkeypatch.setattr(elastic, "_grow_one", counting)
    sched, clock = make("h100:512", policy="argosy", a_nominal=256)
    huge = job("huge", queue="a", devices=500)  # never fits beside the elastic job's minimum
    sched.submit(huge)
    el = job("el", queue="b", devices=32, max_devices=128)
    sched.submit(el)
    sched.cycle()
    assert huge in sched.pending and el.devices <= 128
    before = el.devices
    for _ in range(3):
        clock.advance(sched.config.min_resize_interval_s)
        sched.cycle()
    assert looked == [] and el.devices == before  # 500 pending > the free room: no walk
    check_invariants(sched)
    sched.pending.remove(huge)  # the backlog is gone: the job is looked at and grows
    clock.advance(sched.config.min_resize_interval_s)
    sched.cycle()
    assert looked == ["el"] and el.devices > before
    check_invariants(sched)
