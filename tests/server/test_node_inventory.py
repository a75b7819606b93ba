"""The node inventory across server restarts, and forgetting a node gone for good.

A node the executor stops listing is lost; the store keeps what each node held and since
when it is lost, so a restarted server still lists a lost node (lost, out of placement),
counts its loss once, and an admin may forget it (`DELETE /api/v1/nodes/{name}`) once it
holds nothing. A hypothesis machine checks the same over random losses, returns,
restarts and forgets.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from server_helpers import NODES, STEPS, WORKDIR, app_client

from argosy.cli.jobs import node_state
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig
from argosy.server.control import Control
from argosy.server.node_control import NodeBusyError, NotFoundError
from argosy.server.store import Store


@contextmanager
def _server(home: Path, fake: FakeExecutor) -> Iterator[TestClient]:
    """A server (started anew each time) on `home` over `fake`, with its admin token."""
    with app_client(home, fake) as c:
        yield _admin(c, home)


def _admin(c: TestClient, home: Path) -> TestClient:
    c.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
    return c


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _nodes(api: TestClient) -> dict[str, dict]:
    return {n["name"]: n for n in api.get("/api/v1/nodes").json()}


def _faults(api: TestClient, name: str) -> int:
    history = api.get(f"/api/v1/nodes/{name}").json()["history"]
    return sum(1 for h in history if h["kind"] == "fault")


def test_a_lost_node_stays_listed_lost_across_restarts_and_counts_once(home: Path) -> None:
    fake = FakeExecutor(NODES)
    began = time.time()
    with _server(home, fake) as api:
        fake.nodes.pop()  # n1 goes
        _wait(lambda: not _nodes(api)["n1"]["up"], "the loss was not seen")
        lost_at = _nodes(api)["n1"]["lost_at"]
        assert began <= lost_at <= time.time() and _nodes(api)["n0"]["lost_at"] is None
    for _ in range(2):  # two restarts while it is down
        with _server(home, fake) as api:
            n1 = _nodes(api)["n1"]
            assert not n1["up"] and n1["free"] == 0 and n1["devices"] == 2, n1
            assert n1["lost_at"] == lost_at, "a restart moved when it was lost"
            assert _faults(api, "n1") == 1, "a restart blamed the lost node again"
            assert "lost[/] since " in node_state(n1)
    fake.nodes.append(NODES[1])
    with _server(home, fake) as api:
        _wait(lambda: _nodes(api)["n1"]["up"], "the node did not come back")
        n1 = _nodes(api)["n1"]
        assert n1["free"] == 2 and _faults(api, "n1") == 1 and n1["lost_at"] is None
        assert node_state(n1) == ""


def test_a_node_lost_while_the_server_was_down_is_listed_lost(home: Path) -> None:
    fake = FakeExecutor(NODES)
    with _server(home, fake):
        pass
    fake.nodes.pop()
    with _server(home, fake) as api:
        assert not _nodes(api)["n1"]["up"]
        assert _faults(api, "n1") == 1
        body = {"name": "two", "script": STEPS, "workdir": WORKDIR, "nnodes": 2}
        job = api.post("/api/v1/jobs", json=body | {"exact_nodes": True}).json()
        assert api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "pending"
        assert "node(s)" in api.get(f"/api/v1/jobs/{job['id']}").json()["waiting"]


def test_forgetting_a_node(home: Path) -> None:
    fake = FakeExecutor(NODES)
    with _server(home, fake) as api:
        r = api.delete("/api/v1/nodes/n1")
        assert r.status_code == 409 and "not lost" in r.json()["detail"]
        assert api.delete("/api/v1/nodes/n9").status_code == 404
        spread = {"name": "s", "script": STEPS, "workdir": WORKDIR, "nnodes": 2}
        running = api.post("/api/v1/jobs", json=spread | {"exact_nodes": True}).json()["id"]
        _wait(lambda: running in fake.running, "the two-node job did not start")
        fake.nodes.pop()
        _wait(lambda: not _nodes(api)["n1"]["up"], "the loss was not seen")
        r = api.delete("/api/v1/nodes/n1")
        assert r.status_code == 409 and running in r.json()["detail"], r.text
        api.headers["Authorization"] = "Bearer not-a-token"
        assert api.delete("/api/v1/nodes/n1").status_code in (401, 403)
        _admin(api, home)
        fake.finish(running, None)  # the executor reports the attempt lost: requeued
        _wait(lambda: "n1" not in _nodes(api)["n0"]["jobs"] and not _nodes(api)["n1"]["jobs"], "")
        r = api.delete("/api/v1/nodes/n1")
        assert r.status_code == 200 and r.json()["name"] == "n1", r.text
        assert set(_nodes(api)) == {"n0"}
        job = api.get(f"/api/v1/jobs/{running}").json()  # two nodes can no longer be had
        assert job["state"] == "failed" and "node(s)" in job["reason"], job
    with _server(home, fake) as api:
        assert set(_nodes(api)) == {"n0"}, "a forgotten node came back after a restart"
    fake.nodes.append(NODES[1])
    with _server(home, fake) as api:
        assert _nodes(api)["n1"]["up"], "a forgotten node that returns joins as new"


class InventoryMachine(RuleBasedStateMachine):
    """Losses, returns, restarts and forgets of three nodes, no jobs: after every step the
    server lists every node not forgotten, up exactly when the executor lists it, with
    one fault per loss, and offers only what is up and in service."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.config = ServerConfig(home=Path(self.tmp.name), min_cycle_gap_s=0.0)
        self.store = Store(self.config.database_url)
        self.all = [NodeInfo(f"n{i}", "cpu", 1 + i) for i in range(3)]
        self.fake = FakeExecutor(self.all)
        self.forgotten: set[str] = set()
        self.losses = {n.name: 0 for n in self.all}
        self.ctl = self._start()

    def _start(self) -> Control:
        ctl = Control(self.config, self.store, self.fake)
        ctl.recover()
        return ctl

    def teardown(self) -> None:
        self.store.close()
        self.tmp.cleanup()

    @rule(i=st.integers(0, 2))
    def lose(self, i: int) -> None:
        name = self.all[i].name
        if any(n.name == name for n in self.fake.nodes):
            self.fake.nodes = [n for n in self.fake.nodes if n.name != name]
            if name not in self.forgotten:
                self.losses[name] += 1
        self.ctl._check_nodes()

    @rule(i=st.integers(0, 2))
    def come_back(self, i: int) -> None:
        node = self.all[i]
        if node not in self.fake.nodes:
            self.fake.nodes.append(node)
            self.forgotten.discard(node.name)
        self.ctl._check_nodes()

    @rule()
    def restart(self) -> None:
        self.ctl = self._start()

    @rule(i=st.integers(0, 2))
    def forget(self, i: int) -> None:
        name = self.all[i].name
        lost = name in self.ctl.lost
        try:
            self.ctl.forget_node(name)
        except NotFoundError:
            assert name in self.forgotten
            return
        except NodeBusyError:
            assert not lost or len(self.ctl.scheduling.index) == 1
            return
        assert lost
        self.forgotten.add(name)

    @invariant()
    def listed_as_the_executor_says(self) -> None:
        listed = {n.name for n in self.fake.nodes}
        known = set(self.ctl.scheduling.index)
        assert known == {n.name for n in self.all} - self.forgotten | listed
        assert self.ctl.lost == known - listed
        cap = self.ctl.scheduling.sched.cap
        kept_out = self.ctl.health.out_of_service()  # e.g. lost twice in a day: cordoned
        up = [n for n in self.fake.nodes if n.name not in kept_out]
        assert int(cap.free_devices.sum()) == sum(n.devices for n in up)

    @invariant()
    def one_fault_per_loss(self) -> None:
        for name, count in self.losses.items():
            faults = sum(1 for h in self.ctl.health.history(name) if h["kind"] == "fault")
            assert faults == count, (name, faults, count)


TestInventory = InventoryMachine.TestCase
TestInventory.settings = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class SlotsExecutor(FakeExecutor):
    """An executor whose nodes are this machine's configured slots (`LocalExecutor`)."""

    fixed_inventory = True


def test_a_fixed_inventory_s_earlier_nodes_are_gone_not_lost(home: Path) -> None:
    """A local server restarted with another slot layout lists only the new nodes: the
    old ones were never down, and no loss is counted against them."""
    with _server(home, SlotsExecutor(NODES)) as api:
        assert set(_nodes(api)) == {"n0", "n1"}
    with _server(home, SlotsExecutor([NodeInfo("n0", "cpu", 4)])) as api:
        nodes = _nodes(api)
        assert set(nodes) == {"n0"} and nodes["n0"]["devices"] == 4 and nodes["n0"]["up"]
    with _server(home, FakeExecutor([NodeInfo("n0", "cpu", 4)])) as api:
        assert set(_nodes(api)) == {"n0"}, "a forgotten layout came back"


def test_a_forget_whose_rebuild_cannot_keep_a_running_job_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should the smaller cluster refuse to re-admit a running job (its fit checks run
    again), the forget is refused whole: the node stays known and lost, the job runs,
    the scheduler is the old one (this was a failed assertion halfway through)."""
    from argosy.server.scheduling import Scheduling
    from argosy.server.spec import JobSpec

    config = ServerConfig(home=tmp_path, min_cycle_gap_s=0.0)
    store = Store(config.database_url)
    fake = FakeExecutor([NodeInfo("n0", "cpu", 2), NodeInfo("n1", "cpu", 2)])
    ctl = Control(config, store, fake)
    ctl.recover()
    try:
        fake.nodes.pop()
        ctl._check_nodes()
        job_id = ctl.submit(JobSpec(name="j", script="s.py", nproc_per_node=2), None, "")[0]["id"]
        ctl.step()
        assert job_id in fake.running
        before = ctl.scheduling
        monkeypatch.setattr(Scheduling, "adopt", lambda *args: False)
        with pytest.raises(NodeBusyError, match=job_id):
            ctl.forget_node("n1")
        assert ctl.scheduling is before and "n1" in ctl.lost
        assert "n1" in {r["name"] for r in store.known_nodes()}
        assert ctl.job(job_id)["state"] == "running"
    finally:
        ctl.services.close()
        store.close()
