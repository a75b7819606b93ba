"""Property test of services on the control loop (hypothesis state machine, fake executor):
random service creates and deletes, job submits, process exits, cycles and server
restarts, with the invariants checked after every step.

- every replica process the executor runs belongs to a live service whose stored record
  names that attempt, and no node runs more processes than it has devices;
- a replica that exits is restarted (same node) until `max_restarts`, then the service
  fails; a deleted or failed service never comes back and holds no devices;
- nodes that join later are placed on, and nothing already running is started again.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from argosy.core.errors import ArgosyError
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig
from argosy.server.control import Control
from argosy.server.service_spec import ServiceSpec
from argosy.server.services import SERVICE_TERMINAL, is_replica
from argosy.server.spec import JobSpec
from argosy.server.store import Store

NODES = [NodeInfo("n0", "cpu", 3), NodeInfo("n1", "cpu", 3)]


class StepClock:
    """The control loop's clock, moved by the `step` rule only: the scheduler's decisions
    (submit times, ages) repeat when hypothesis replays a case, as its draws must."""

    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def now_s(self) -> float:
        return self.t


class ServicesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        home = Path(self.tmp.name)
        self.config = ServerConfig(home=home, min_cycle_gap_s=0.0, nodes_interval_s=1e-6)
        self.store = Store(self.config.database_url)
        self.fake = FakeExecutor(list(NODES))
        self.clock = StepClock()
        self.ctl = self._control()
        self.services: list[str] = []
        self.final: dict[str, str] = {}

    def _control(self) -> Control:
        ctl = Control(self.config, self.store, self.fake, clock=self.clock)
        ctl.recover()
        return ctl

    def teardown(self) -> None:
        self.ctl.services.close()
        self.store.close()
        self.tmp.cleanup()

    @rule(replicas=st.integers(1, 7), restarts=st.integers(0, 2))
    def create_service(self, replicas: int, restarts: int) -> None:
        spec = ServiceSpec(name="s", replicas=replicas, max_restarts=restarts)
        try:
            row = self.ctl.submit_service(spec)
        except ArgosyError:
            known = self.ctl.scheduling.nodes  # a node that just joined is seen at the next step
            assert replicas > sum(n.devices for n in known)  # only too many
            return
        self.services.append(row["id"])

    @precondition(lambda self: self.services)
    @rule(data=st.data())
    def delete_service(self, data: st.DataObject) -> None:
        self.ctl.delete_service(data.draw(st.sampled_from(self.services)))

    @rule(nproc=st.integers(1, 3))
    def submit_job(self, nproc: int) -> None:
        try:
            self.ctl.submit(JobSpec(name="j", script="s.py", nproc_per_node=nproc), None, "")
        except ArgosyError as err:  # only what the scheduler would reject at once
            biggest = max(n.devices for n in self.ctl.scheduling.nodes)
            assert nproc > biggest or "beside pinned reservations" in str(err), err

    @precondition(lambda self: self.fake.running)
    @rule(which=st.integers(0, 63), code=st.sampled_from([0, 1, 137, None]))
    def process_exits(self, which: int, code: int | None) -> None:
        running = sorted(self.fake.running)  # a draw whose range does not follow the state
        self.fake.finish(running[which % len(running)], code)

    @rule()
    def step(self) -> None:
        self.clock.t += 1.0
        self.ctl.last_cycle_s = 0.0
        self.ctl.step()

    @precondition(lambda self: len(self.fake.nodes) < 4)
    @rule(devices=st.integers(1, 3))
    def node_joins(self, devices: int) -> None:
        self.fake.nodes.append(NodeInfo(f"n{len(self.fake.nodes)}", "cpu", devices))

    @rule()
    def server_restarts(self) -> None:
        self.ctl.services.close()
        self.ctl = self._control()

    @invariant()
    def replica_processes_match_the_store(self) -> None:
        for key, request in self.fake.running.items():
            if not is_replica(key):
                continue
            service_id, _, index = key.rpartition(".r")
            row = self.store.get_service(service_id)
            assert row is not None and row["state"] not in SERVICE_TERMINAL, row
            rec = next(r for r in row["replicas"] if r["index"] == int(index))
            assert rec["attempt"] == request.attempt and rec["state"] in ("starting", "ready")
            assert list(request.nodes) == [rec["node"]]

    @invariant()
    def no_node_runs_more_than_it_has(self) -> None:
        used: dict[str, int] = {}
        for request in self.fake.running.values():
            for node, k in request.nodes.items():
                used[node] = used.get(node, 0) + k
        assert all(used.get(n.name, 0) <= n.devices for n in self.fake.nodes), used
        for n in self.fake.nodes:
            if n.name in self.ctl.scheduling.index:
                assert self.ctl.scheduling.used_on(n.name) <= n.devices
        assert len(self.fake.started) == len(set(self.fake.started))  # no attempt twice

    @invariant()
    def ended_services_stay_ended_and_hold_nothing(self) -> None:
        for service_id in self.services:
            row = self.store.get_service(service_id)
            assert row is not None
            if service_id in self.final:
                assert row["state"] == self.final[service_id]
            elif row["state"] in SERVICE_TERMINAL:
                self.final[service_id] = row["state"]
            if row["state"] in SERVICE_TERMINAL:
                assert service_id not in self.ctl.scheduling.workloads
                spec = row["spec"]
                assert all(r["restarts"] <= spec["max_restarts"] + 1 for r in row["replicas"])


ServicesMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
test_services_properties = ServicesMachine.TestCase
