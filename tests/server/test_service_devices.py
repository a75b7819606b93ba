"""Replicas never share a device: a replica does not start on a device another service's
replica still holds while it yields; a restart recovers the replicas' slots."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from argosy.executors.base import NodeInfo
from argosy.server.service_spec import ServiceSpec, TidalSpec
from argosy.server.tidal import HOLDING
from tests.server.test_control_decisions import FakeAdmin, Loop


class SlowSleep(FakeAdmin):
    """A sleep takes a while (the replica frees its memory): held until released."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def sleep(self, url: str, token: str, level: int) -> dict[str, Any]:
        assert self.gate.wait(10)
        return super().sleep(url, token, level)


def _holders(loop: Loop) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in loop.ctl.services.active.values():
        for r in row["replicas"]:
            if r["state"] in HOLDING:
                out[r["node"]] = out.get(r["node"], 0) + 1
    return out


def _step(loop: Loop, advance_s: float = 1.0) -> None:
    loop.step(advance_s)
    for p in list(loop.ctl.services._probes.values()):
        p.result(timeout=10)


def test_a_replica_waits_for_the_device_another_service_yields(tmp_path: Path) -> None:
    loop = Loop(tmp_path, [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
    admin = SlowSleep()
    loop.ctl.lease.admin = admin
    loop.ctl.services.health_interval_s = 0.0

    def tidal(levels: list[float]) -> TidalSpec:
        return TidalSpec(levels=levels, period_s=120.0, lead_s=0.0)

    submit = loop.ctl.submit_service
    submit(ServiceSpec(name="A", replicas=1, tidal=tidal([0.5, 0.0, 0.0])))
    submit(ServiceSpec(name="B", replicas=1, tidal=tidal([0.0, 0.0, 0.5])))
    for _ in range(3):
        _step(loop)
    loop.clock.advance(40)
    for _ in range(3):
        _step(loop)
        assert all(k <= 1 for k in _holders(loop).values()), _holders(loop)
    admin.gate.set()
    for _ in range(4):
        for c in list(loop.ctl.lease.calls.values()):
            c.future.result(timeout=10)
        _step(loop)
        assert all(k <= 1 for k in _holders(loop).values()), _holders(loop)
    states = {
        row["spec"]["name"]: [r["state"] for r in row["replicas"]]
        for row in loop.ctl.services.active.values()
    }
    assert states == {"A": ["asleep"], "B": ["ready"]}, states
