"""A tidal replica whose device another attempt took while it slept (the executor's
device book says so at its wake) is not woken onto that device: it is stopped and started
afresh on a free one, and that restart is not counted against it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from test_tidal_properties import PERIOD_S, FakeAdmin, _control, _settle

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.service_spec import ServiceSpec, TidalSpec
from argosy.server.services import DEVICE_TAKEN, replica_key
from argosy.server.spec import JobSpec


def test_a_replica_whose_device_was_taken_starts_afresh() -> None:
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
