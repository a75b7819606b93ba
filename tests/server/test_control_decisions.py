"""The control loop applies a cycle's decisions one by one: a start never meets a job
stopped again in the same cycle, one decision's failure does not drop the others, and
elastic resizes stay consistent through server restarts, node losses and the restart
budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tidal_fakes import FAST
from tidal_fakes import InstantAdmin as FakeAdmin

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig
from argosy.server.control import Control
from argosy.server.scheduling import Scheduling
from argosy.server.spec import JobSpec
from argosy.server.store import Store


def spec(*, nnodes: int = 1, per_node: int = 1, elastic_to: int = 0, **extra: Any) -> JobSpec:
    body: dict[str, Any] = {
        "name": "j",
        "script": "t.py",
        "nnodes": nnodes,
        "nproc_per_node": per_node,
    }
    if elastic_to:
        body["elastic"] = {"min_nnodes": nnodes, "max_nnodes": elastic_to}
    return JobSpec.model_validate(body | extra)


class Loop:
    """A `Control` on a `FakeExecutor`, stepped by hand; `restart` is a new server on the
    same store and executor."""

    def __init__(
        self,
        home: Path,
        nodes: list[NodeInfo],
        executor: FakeExecutor | None = None,
        **config: Any,
    ):
        self.config = ServerConfig(
            home=home, min_cycle_gap_s=0.0, nodes_interval_s=1e9, scheduler=FAST, **config
        )
        self.store = Store(self.config.database_url)
        self.fake = executor or FakeExecutor(nodes)
        self.clock = FakeClock(0.0)
        self.ctl = self._control()

    def _control(self) -> Control:
        ctl = Control(
            self.config,
            self.store,
            self.fake,
            clock=self.clock,
            admin=FakeAdmin(),
            probe=lambda url: True,
        )
        ctl.recover()
        return ctl

    def restart(self) -> None:
        self.ctl = self._control()

    def step(self, advance_s: float = 1.0) -> None:
        self.clock.advance(advance_s)
        self.ctl.poke()
        self.ctl.last_cycle_s = 0.0
        self.ctl.step()

    def submit(self, s: JobSpec) -> str:
        return self.ctl.submit(s, None, "")[0]["id"]

    def state(self, job_id: str) -> str:
        return self.store.get_job(job_id)["state"]

    def consistent(self) -> None:
        """Scheduler, store and executor agree on what runs and what waits."""
        active = {r["id"] for r in self.store.jobs_in(["admitted", "running"])}
        pending = {r["id"] for r in self.store.jobs_in(["pending"])}
        sched = self.ctl.scheduling
        running = {j for j in sched.workloads if sched.is_running(j)}
        waiting = {j for j in active if self.ctl.lease.waiting(j)}
        assert running == active, (running, active)
        assert {j for j in sched.workloads if not sched.is_running(j)} == pending
        assert set(self.fake.running) == active - waiting, (self.fake.running, active, waiting)


# ---- a start and an eviction of one job in one cycle ----------------------------------


def test_a_job_started_in_a_cycle_is_not_evicted_in_it() -> None:
    nodes = [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1), NodeInfo("n2", "cpu", 4)]
    s = Scheduling(nodes, None, "argosy", FAST, FakeClock(0.0))
    assert not s.submit("j0", spec(elastic_to=2), 0.0)
    assert not s.submit("j1", spec(), 0.0)
    s.cycle()
    s.set_in_service("n1", False)
    assert not s.submit("j2", spec(elastic_to=2, priority=1), 0.0)
    s.cycle()
    assert not s.submit("j3", spec(elastic_to=2, priority=1), 0.0)
    decisions = s.cycle()
    started = {d.workload.id for d in decisions if d.action == "start"}
    stopped = {d.workload.id for d in decisions if d.action == "preempt"}
    assert not started & stopped, [(d.action, d.workload.id) for d in decisions]
    for job_id in started:
        assert s.is_running(job_id)
        s.placement(job_id)


def test_start_then_eviction_keeps_control_consistent(tmp_path: Path) -> None:
    nodes = [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1), NodeInfo("n2", "cpu", 4)]
    loop = Loop(tmp_path, nodes)
    loop.submit(spec(elastic_to=2))
    loop.submit(spec())
    loop.step()
    loop.ctl.set_cordon("n1", True)
    loop.submit(spec(elastic_to=2, priority=1))
    loop.step()
    loop.submit(spec(elastic_to=2, priority=1))
    for _ in range(4):
        loop.step()
        loop.consistent()


def test_one_failing_decision_does_not_drop_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = Loop(tmp_path, [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
    bad, good = loop.submit(spec()), loop.submit(spec())
    real = Control._start

    def start(self: Control, job_id: str) -> None:
        if job_id == bad:
            raise RuntimeError("boom")
        real(self, job_id)

    monkeypatch.setattr(Control, "_start", start)
    loop.step()
    assert loop.state(good) == "running"
    assert loop.state(bad) == "pending"
    assert not loop.ctl.scheduling.is_running(bad)  # queued again, not orphaned
    monkeypatch.setattr(Control, "_start", real)
    loop.step()
    assert loop.state(bad) == "running"
    loop.consistent()


# ---- a server restart in the middle of a resize ----------------------------------------


def _grown(tmp_path: Path) -> tuple[Loop, str]:
    """An elastic job (1..2 x 1) beside a fixed job that ends: the cycle grows it and
    asks its attempt to stop (the stop's exit not yet polled)."""
    loop = Loop(tmp_path, [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
    fixed = loop.submit(spec())
    loop.step()
    el = loop.submit(spec(elastic_to=2))
    loop.step()
    loop.clock.advance(20)
    loop.fake.finish(fixed, 0)
    loop.step()
    assert loop.store.get_job(el)["stop_requested"] == "resize"
    return loop, el


def test_restart_before_a_resize_stop_is_polled_starts_the_job_once(tmp_path: Path) -> None:
    loop, el = _grown(tmp_path)
    loop.ctl.services.close()
    loop.restart()
    row = loop.store.get_job(el)
    assert row["state"] == "pending" and "interrupted" in row["reason"]
    for _ in range(3):
        loop.step()  # FakeExecutor.start asserts a running job is never started again
        loop.consistent()
    row = loop.store.get_job(el)
    assert row["state"] == "running" and row["attempts"] == 2
    assert sum(row["placement"]["nodes"].values()) == 2


def test_restart_while_a_resized_job_waits_for_its_relaunch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, el = _grown(tmp_path)
    monkeypatch.setattr(type(loop.ctl.lease), "ready_to_relaunch", lambda *a: False)
    loop.step()  # the stop's exit is taken in; the relaunch waits
    row = loop.store.get_job(el)
    assert (row["state"], row["reason"]) == ("admitted", "resizing")
    monkeypatch.undo()
    loop.ctl.services.close()
    loop.restart()
    row = loop.store.get_job(el)
    assert row["state"] == "pending" and "interrupted" in row["reason"]
    for _ in range(3):
        loop.step()
        loop.consistent()
    row = loop.store.get_job(el)
    assert row["state"] == "running" and row["attempts"] == 2


# ---- max_restarts counts lost attempts, not attempts ------------------------------------


def test_resizes_do_not_use_up_max_restarts(tmp_path: Path) -> None:
    loop = Loop(tmp_path, [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)])
    fixed = loop.submit(spec())
    loop.step()
    el = loop.submit(spec(elastic_to=2, max_restarts=1))
    loop.step()
    loop.clock.advance(20)
    loop.fake.finish(fixed, 0)
    for _ in range(4):
        loop.step()
    assert loop.store.get_job(el)["attempts"] == 2  # grown: attempt 2 on both nodes
    loop.fake.finish(el, None)  # the one loss max_restarts=1 allows
    for _ in range(2):
        loop.step()
    row = loop.store.get_job(el)
    assert row["state"] == "running" and row["attempts"] == 3, row["reason"]
    loop.fake.finish(el, None)  # the second loss: past max_restarts
    loop.step()
    row = loop.store.get_job(el)
    assert row["state"] == "failed" and "max_restarts=1 used up" in row["reason"]


# ---- a resize's new node goes out of service before the relaunch ------------------------


@pytest.mark.parametrize("how", ["cordon", "lost"])
def test_a_resize_relaunch_never_starts_on_a_node_gone_out_of_service(
    tmp_path: Path, how: str
) -> None:
    nodes = [NodeInfo("n0", "cpu", 1), NodeInfo("n1", "cpu", 1)]
    loop = Loop(tmp_path, nodes, FakeExecutor(list(nodes)))
    fixed = loop.submit(spec())
    loop.step()
    el = loop.submit(spec(elastic_to=2))
    loop.step()
    first = set(loop.fake.running[el].nodes)
    loop.clock.advance(20)
    loop.fake.finish(fixed, 0)
    loop.step()  # grown onto both nodes; the attempt is asked to stop
    (gained,) = set(loop.ctl.scheduling.placement(el).nodes) - first
    if how == "cordon":
        loop.ctl.set_cordon(gained, True)
    else:
        loop.fake.nodes.remove(next(n for n in nodes if n.name == gained))
        loop.ctl._check_nodes()
    for _ in range(3):
        loop.step()
        loop.consistent()
        if el in loop.fake.running:
            assert gained not in loop.fake.running[el].nodes
    row = loop.store.get_job(el)
    assert row["state"] == "running" and set(row["placement"]["nodes"]) == first
    assert "attempt_lost" not in [e["kind"] for e in loop.store.list_events(job_id=el)[0]]


# ---- a start on devices an attempt that stops still holds ------------------------------


class StoppingSlowly(FakeExecutor):
    """A stopped attempt exits only when the test says so (it checkpoints first), and
    holds its devices until then, as the local executor counts them."""

    def stop(self, job_id: str) -> None:
        self.stopping.add(job_id)

    stopping: set[str] = set()


TWO_QUEUES = """queues:
  - name: a
    quota: {cpu: {nominal: 0}}
  - name: b
    quota: {cpu: {nominal: 2}}
"""


def test_a_job_waits_for_the_devices_of_the_job_preempted_for_it(tmp_path: Path) -> None:
    fake = StoppingSlowly([NodeInfo("n0", "cpu", 2)])
    fake.stopping = set()
    (tmp_path / "queues.yaml").write_text(TWO_QUEUES)
    loop = Loop(tmp_path / "home", [], fake, queues_file=tmp_path / "queues.yaml")
    low = loop.submit(spec(per_node=2, queue="a"))
    loop.step()
    high = loop.submit(spec(per_node=2, queue="b"))  # b takes back its nominal share
    for _ in range(3):
        loop.step()
        assert low in fake.stopping  # preempted: it checkpoints before it exits
        assert set(fake.running) == {low}  # the other never started on its devices
        assert loop.state(high) == "pending"
    fake.finish(low, 130)
    loop.step()
    loop.step()
    assert loop.state(high) == "running" and loop.state(low) == "pending"
    assert fake.started == [(low, 1), (high, 1)]
    loop.consistent()


class ShowsDevices(FakeExecutor):
    def devices_of(self, job_id: str) -> str:
        return "CUDA_VISIBLE_DEVICES=3" if job_id in self.running else ""


def test_an_attempt_s_start_event_names_the_devices_it_sees(tmp_path: Path) -> None:
    loop = Loop(tmp_path, [], ShowsDevices([NodeInfo("n0", "h100-sxm", 4)]))
    job_id = loop.submit(spec(chips=["h100-sxm"]))
    loop.step()
    events = loop.store.list_events(job_id=job_id, limit=10)[0]
    assert "attempt 1 started (CUDA_VISIBLE_DEVICES=3)" in [e["message"] for e in events]
