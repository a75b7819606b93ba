"""Tidal replicas and the executor's devices: a replica whose device another attempt took
while it slept (the executor's device book says so at its wake) is started afresh on a
free one; a replica wakes beside training on its node; and where the executor cannot lend
a sleeping replica's device (Ray), a replica yields by stopping instead."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from test_tidal_properties import (
    PERIOD_S,
    TWO_TROUGHS,
    FakeAdmin,
    _awake_enough,
    _control,
    _exclusive,
    _settle,
)

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server import tidal_replicas
from argosy.server.service_spec import ServiceSpec, TidalSpec
from argosy.server.spec import ElasticSpec, JobSpec
from argosy.server.tidal_replicas import DEVICE_TAKEN, YIELD_BY_STOP, replica_key


def test_a_replica_whose_device_was_taken_starts_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tidal_replicas, "TAKEN_GRACE_S", 0.0)  # (it waits for stopping ranks first)
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeExecutor([NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
        clock, admin = FakeClock(0.0), FakeAdmin()
        ctl = _control(Path(tmp), fake, clock, admin)
        levels = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
        tidal = TidalSpec(levels=levels, period_s=PERIOD_S, lead_s=0.0, min_replicas=0)
        service_id = ctl.submit_service(ServiceSpec(name="chat", replicas=1, tidal=tidal))["id"]
        key = replica_key(service_id, 0)
        try:
            step_s, lent_seen = PERIOD_S / len(levels), False
            while clock.now_s() < PERIOD_S:
                _settle(ctl, admin, lambda: None)
                rec = ctl.services.active[service_id]["replicas"][0]
                if rec["state"] == "asleep":
                    lent_seen |= key in fake.lent  # the executor was told it lends
                    fake.taken.add(key)  # someone holds its device now
                clock.advance(step_s / 3)
            _settle(ctl, admin, lambda: None)
            rec = ctl.services.active[service_id]["replicas"][0]
        finally:
            ctl.services.close()
            ctl.store.close()
        assert lent_seen
        messages = [
            e["message"]
            for e in ctl.store.list_events(job_id=service_id, limit=1000)[0]
            if e["kind"] == "replica_exited"
        ]
        assert any(DEVICE_TAKEN in m for m in messages), messages
        assert rec["state"] == "ready" and rec["attempt"] == 2 and rec["restarts"] == 0
        assert ("wake", f"http://{rec['address']}:{rec['port']}") not in admin.calls


def test_a_replica_wakes_beside_training_on_its_node() -> None:
    """One host of three devices: a fixed two-device job runs all day beside a tidal
    replica, which sleeps through the trough and wakes at the rise on its own device
    (before, a replica waited for every training rank to leave its node)."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeExecutor([NodeInfo("host", "cpu", 3)])
        clock, admin = FakeClock(0.0), FakeAdmin()
        ctl = _control(Path(tmp), fake, clock, admin)
        levels = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
        tidal = TidalSpec(levels=levels, period_s=PERIOD_S, lead_s=0.0, min_replicas=0)
        service_id = ctl.submit_service(ServiceSpec(name="chat", replicas=1, tidal=tidal))["id"]
        _settle(ctl, admin, lambda: None)
        job = JobSpec(name="train", script="t.py", nnodes=1, nproc_per_node=2)
        job_id = ctl.submit(job, None, "")[0]["id"]
        states: list[str] = []
        try:
            while clock.now_s() < PERIOD_S:
                clock.advance(PERIOD_S / len(levels) / 3)
                _settle(ctl, admin, lambda: None)
                assert fake.running[job_id].nodes == {"host": 2}  # it runs throughout
                states.append(ctl.services.active[service_id]["replicas"][0]["state"])
        finally:
            ctl.services.close()
            ctl.store.close()
        assert "asleep" in states
        assert states[-1] == "ready", states
        assert [c for c, _ in admin.calls] == ["sleep", "wake"]


class KeepsSleepersDevices(FakeExecutor):
    """As the Ray executor: a sleeping replica's devices cannot go to another attempt."""

    lends_sleeping = False


def test_where_a_sleeping_replica_cannot_lend_it_yields_by_stopping() -> None:
    """Over a tidal day on such an executor no replica is put to sleep: it stops at the
    trough (holding its device until gone), the elastic job grows into what it freed, and
    at the rise it is started afresh; the lease's invariants hold at every step, and the
    stops count as neither failures nor restarts."""
    s = TWO_TROUGHS
    with tempfile.TemporaryDirectory() as tmp:
        fake = KeepsSleepersDevices([NodeInfo(f"n{i}", "cpu", 1) for i in range(3)])
        clock, admin = FakeClock(0.0), FakeAdmin()
        ctl = _control(Path(tmp), fake, clock, admin)
        tidal = TidalSpec(levels=s["levels"], period_s=PERIOD_S, lead_s=20.0, min_replicas=0)
        service_id = ctl.submit_service(ServiceSpec(name="chat", replicas=2, tidal=tidal))["id"]
        _settle(ctl, admin, lambda: None)
        elastic = ElasticSpec(min_nnodes=1, max_nnodes=3)
        job = JobSpec(name="train", script="t.py", nnodes=1, elastic=elastic)
        job_id = ctl.submit(job, None, "")[0]["id"]
        sizes = set()
        try:
            while clock.now_s() < 2 * PERIOD_S:
                clock.advance(PERIOD_S / len(s["levels"]) / 3)
                _settle(ctl, admin, lambda: _exclusive(ctl, fake, s, job_id))
                _awake_enough(ctl, s, clock.now_s())
                if job_id in fake.running:
                    sizes.add(sum(fake.running[job_id].nodes.values()))
            replicas = ctl.services.active[service_id]["replicas"]
            events = ctl.store.list_events(job_id=service_id, limit=10_000)[0]
        finally:
            ctl.services.close()
            ctl.store.close()
        assert admin.calls == []  # never asked to sleep or wake
        yields = [e["message"] for e in events if e["kind"] == "yield"]
        assert yields and all(YIELD_BY_STOP in m for m in yields)
        assert ctl.lease.counts["yield"] == len(yields)
        assert max(sizes) == 3 and min(sizes) == 1  # it grew into the stopped replicas' nodes
        assert all(r["state"] == "ready" and r["restarts"] == 0 for r in replicas), replicas
        assert all(r["attempt"] >= 2 for r in replicas)  # each started afresh at a rise
