"""Replicas never share a device: a replica does not start on a device another service's
replica still holds while it yields; a restart recovers the replicas' slots."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
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


def _restart_after_node_loss(tmp_path: Path, sizes: list[int]) -> Loop:
    nodes = [NodeInfo(f"n{i}", "cpu", d) for i, d in enumerate(sizes)]
    loop = Loop(tmp_path, nodes, FakeExecutor(list(nodes)))
    loop.ctl.services.health_interval_s = 0.0
    sid = loop.ctl.submit_service(ServiceSpec(name="chat", replicas=2))["id"]
    for _ in range(4):
        _step(loop)
    recs = loop.ctl.services.active[sid]["replicas"]
    assert [(r["node"], r["state"]) for r in recs] == [("n0", "ready"), ("n1", "ready")]
    loop.fake.nodes.remove(nodes[0])
    loop.fake.finish(f"{sid}.r0", None, (0,))  # n0 lost, replica 0 with it
    loop.ctl._check_nodes()
    loop.ctl.services.close()
    loop.restart()
    loop.ctl.services.health_interval_s = 0.0
    return loop


def _within_devices(loop: Loop, sizes: dict[str, int]) -> None:
    running: dict[str, int] = {}
    for request in loop.fake.running.values():
        for node, k in request.nodes.items():
            running[node] = running.get(node, 0) + k
    assert all(running[n] <= sizes[n] for n in running), running
    held = _holders(loop)
    assert all(held[n] <= sizes[n] for n in held), held


def test_a_restart_after_a_node_loss_keeps_replicas_in_their_slots(tmp_path: Path) -> None:
    loop = _restart_after_node_loss(tmp_path, [1, 1, 1])  # n2: room for replica 0
    sizes = {"n0": 1, "n1": 1, "n2": 1}
    for _ in range(4):
        _step(loop)
        _within_devices(loop, sizes)
    (row,) = loop.ctl.services.active.values()
    got = sorted((r["node"], r["state"]) for r in row["replicas"])
    assert got == [("n1", "ready"), ("n2", "ready")], got
    kept = next(r for r in row["replicas"] if r["index"] == 1)
    assert (kept["node"], kept["attempt"]) == ("n1", 1)  # never moved nor restarted


def test_a_restart_after_a_node_loss_without_room_never_doubles_a_device(
    tmp_path: Path,
) -> None:
    loop = _restart_after_node_loss(tmp_path, [1, 1])
    for _ in range(5):
        _step(loop)
        _within_devices(loop, {"n0": 1, "n1": 1})
    (row,) = loop.ctl.services.active.values()
    assert [r["state"] for r in row["replicas"]].count("ready") == 1


def test_a_restart_keeps_a_replica_on_a_cordoned_node(tmp_path: Path) -> None:
    nodes = [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)]
    loop = Loop(tmp_path, nodes)
    loop.ctl.services.health_interval_s = 0.0
    sid = loop.ctl.submit_service(ServiceSpec(name="chat", replicas=1))["id"]
    for _ in range(3):
        _step(loop)
    (rec,) = loop.ctl.services.active[sid]["replicas"]
    loop.ctl.set_cordon(rec["node"], True)
    before = loop.ctl.scheduling.replica_nodes(sid)
    loop.ctl.services.close()
    loop.restart()
    assert loop.ctl.scheduling.replica_nodes(sid) == before
    for _ in range(3):
        _step(loop)
    (after,) = loop.ctl.services.active[sid]["replicas"]
    assert (after["node"], after["attempt"], after["state"]) == (rec["node"], 1, "ready")


def test_a_restart_does_not_book_an_asleep_replica_device(tmp_path: Path) -> None:
    loop = Loop(tmp_path, [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
    loop.ctl.services.health_interval_s = 0.0
    tidal = TidalSpec(levels=[0.5, 0.0, 0.0], period_s=120.0, lead_s=0.0)
    sid = loop.ctl.submit_service(ServiceSpec(name="A", replicas=1, tidal=tidal))["id"]
    for _ in range(3):
        _step(loop)
    loop.clock.advance(40)
    for _ in range(3):
        for c in list(loop.ctl.lease.calls.values()):
            c.future.result(timeout=10)
        _step(loop)
    assert [r["state"] for r in loop.ctl.services.active[sid]["replicas"]] == ["asleep"]
    assert loop.ctl.scheduling.replica_nodes(sid) == []
    loop.ctl.services.close()
    loop.restart()
    assert loop.ctl.scheduling.replica_nodes(sid) == []


class DeadNodeExecutor(FakeExecutor):
    """A start pinned to a node that is gone is lost at once (as on Ray)."""

    def start(self, request: Any) -> None:
        super().start(request)
        if not set(request.nodes) <= {n.name for n in self.nodes}:
            self.finish(request.job_id, None)


def test_a_replica_on_a_lost_node_starts_again_elsewhere(tmp_path: Path) -> None:
    nodes = [NodeInfo(f"n{i}", "cpu", 1) for i in range(3)]
    loop = Loop(tmp_path, nodes, DeadNodeExecutor(list(nodes)))
    loop.ctl.services.health_interval_s = 0.0
    sid = loop.ctl.submit_service(ServiceSpec(name="chat", replicas=1, max_restarts=0))["id"]
    for _ in range(3):
        _step(loop)
    (rec,) = loop.ctl.services.active[sid]["replicas"]
    gone = rec["node"]
    loop.fake.nodes.remove(next(n for n in nodes if n.name == gone))
    loop.fake.finish(f"{sid}.r0", None, (0,))
    loop.ctl._check_nodes()
    for _ in range(6):
        _step(loop)
    row = loop.store.get_service(sid)
    assert row["state"] == "running", row["reason"]
    (rec,) = row["replicas"]
    assert rec["node"] != gone and rec["state"] == "ready" and rec["restarts"] == 0
    assert loop.ctl.scheduling.replica_nodes(sid) == [rec["node"]]


def test_a_restart_keeps_the_slot_of_a_replica_lost_with_its_node(tmp_path: Path) -> None:
    nodes = [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 2)]
    loop = Loop(tmp_path, nodes, FakeExecutor(list(nodes)))
    loop.ctl.services.health_interval_s = 0.0
    tidal = TidalSpec(levels=[0.0, 0.5, 0.0], period_s=120.0, lead_s=0.0)
    sid = loop.ctl.submit_service(ServiceSpec(name="A", replicas=3, tidal=tidal))["id"]
    _step(loop)
    assert loop.ctl.scheduling.replica_nodes(sid) == ["n0", "n1"]
    loop.fake.nodes.remove(nodes[1])
    loop.fake.finish(f"{sid}.r1", None, (0,))
    loop.ctl._check_nodes()
    for _ in range(3):
        _step(loop)
    before = loop.ctl.scheduling.replica_nodes(sid)
    loop.ctl.services.close()
    loop.restart()
    assert loop.ctl.scheduling.replica_nodes(sid) == before


def test_a_restart_while_a_replica_yields_does_not_book_its_device(tmp_path: Path) -> None:
    loop = Loop(tmp_path, [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
    admin = SlowSleep()
    loop.ctl.lease.admin = admin
    loop.ctl.services.health_interval_s = 0.0
    tidal = TidalSpec(levels=[0.5, 0.0, 0.0], period_s=120.0, lead_s=0.0)
    sid = loop.ctl.submit_service(ServiceSpec(name="A", replicas=1, tidal=tidal))["id"]
    for _ in range(3):
        _step(loop)
    loop.clock.advance(40)
    _step(loop)
    assert [r["state"] for r in loop.ctl.services.active[sid]["replicas"]] == ["yielding"]
    before = loop.ctl.scheduling.replica_nodes(sid)
    assert before == []
    loop.ctl.services.close()
    admin.gate.set()
    loop.restart()
    assert loop.ctl.scheduling.replica_nodes(sid) == before


def test_a_restart_hands_every_service_over_before_moving_a_replica(tmp_path: Path) -> None:
    nodes = [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)]
    loop = Loop(tmp_path, nodes, FakeExecutor(list(nodes)))
    loop.ctl.services.health_interval_s = 0.0
    a = loop.ctl.submit_service(ServiceSpec(name="A", replicas=1))["id"]
    b = loop.ctl.submit_service(ServiceSpec(name="B", replicas=1))["id"]
    for _ in range(3):
        _step(loop)
    (rec,) = loop.ctl.services.active[a]["replicas"]
    lost = next(n for n in nodes if n.name == rec["node"])
    loop.fake.nodes.remove(lost)
    loop.fake.finish(f"{a}.r0", None, (0,))
    loop.ctl._check_nodes()
    loop.ctl.services.close()
    loop.restart()
    loop.ctl.services.health_interval_s = 0.0
    sizes = {"n0": 1, "n1": 1}
    _within_devices(loop, sizes)
    for _ in range(3):
        _step(loop)
        _within_devices(loop, sizes)
    (kept,) = loop.ctl.services.active[b]["replicas"]
    assert (kept["state"], kept["attempt"]) == ("ready", 1)


def test_a_restart_books_only_the_replicas_a_tidal_service_wants_now(tmp_path: Path) -> None:
    loop = Loop(tmp_path, [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
    loop.ctl.services.health_interval_s = 0.0
    tidal = TidalSpec(levels=[0.5, 0.0, 0.0], period_s=120.0, lead_s=0.0)
    sid = loop.ctl.submit_service(ServiceSpec(name="A", replicas=1, tidal=tidal))["id"]
    _step(loop)
    loop.clock.advance(40)  # the trough: the scheduler drops the slot before it is ready
    _step(loop, 0.0)  # it turns ready after the lease looked: not yet yielding
    (rec,) = loop.ctl.services.active[sid]["replicas"]
    assert loop.ctl.scheduling.replica_nodes(sid) == [] and rec["state"] == "ready"
    loop.ctl.services.close()
    loop.restart()
    assert loop.ctl.scheduling.replica_nodes(sid) == []
