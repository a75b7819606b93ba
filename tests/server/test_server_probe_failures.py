"""A single failed health probe of a ready replica shows: its count in the service view
and one `replica_probe_failed` event; a passing probe clears the count; the third in a
row restarts the replica (`replica_unhealthy`)."""

from __future__ import annotations

import time
from pathlib import Path

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig
from argosy.server.control import Control
from argosy.server.service_spec import ServiceSpec
from argosy.server.store import Store
from argosy.server.views import service_view


def _settled(ctl: Control, sid: str, check) -> dict:  # noqa: ANN001
    deadline = time.monotonic() + 10
    while True:
        ctl.poke()
        ctl.step()
        view = service_view(ctl.service(sid)).model_dump()
        if check(view) or time.monotonic() > deadline:
            assert check(view), view
            return view
        time.sleep(0.01)


def test_failed_probes_are_counted_shown_and_cleared(tmp_path: Path) -> None:
    healthy = {"ok": True}
    fake = FakeExecutor([NodeInfo("n0", "cpu", 2)])
    config = ServerConfig(home=tmp_path, min_cycle_gap_s=0.0, nodes_interval_s=1e9)
    ctl = Control(config, Store(config.database_url), fake, clock=FakeClock(),
                  probe=lambda url: healthy["ok"])  # fmt: skip
    ctl.services.health_interval_s = 0.0
    ctl.recover()
    sid = ctl.submit_service(ServiceSpec(name="s"))["id"]
    _settled(ctl, sid, lambda v: v["replicas"] and v["replicas"][0]["state"] == "ready")
    healthy["ok"] = False
    view = _settled(ctl, sid, lambda v: v["replicas"][0]["failed_probes"] >= 1)
    assert view["replicas"][0]["state"] == "ready"
    healthy["ok"] = True
    _settled(ctl, sid, lambda v: v["replicas"][0]["failed_probes"] == 0)
    kinds = [e["kind"] for e in ctl.store.list_events(job_id=sid, cursor=0, limit=100)[0]]
    assert kinds.count("replica_probe_failed") >= 1 and "replica_unhealthy" not in kinds
    healthy["ok"] = False
    _settled(ctl, sid, lambda v: v["replicas"][0]["restarts"] == 1 or not fake.running)
    kinds = [e["kind"] for e in ctl.store.list_events(job_id=sid, cursor=0, limit=100)[0]]
    assert "replica_unhealthy" in kinds
    ctl.services.close()
    ctl.store.close()
