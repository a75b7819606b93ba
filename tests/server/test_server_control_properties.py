"""Property test of the control loop (hypothesis state machine, no processes): random
submits, cancels, exits, cordons, cycles and server restarts over a fake executor, with
the invariants checked after every step.

- the executor runs exactly the jobs the store calls admitted or running, each once;
- the scheduler's running set is that same set, and no node holds more than it has;
- a job in a terminal state never leaves it; attempts never exceed max_restarts + 1.
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
from argosy.server.schemas import ACTIVE, TERMINAL
from argosy.server.spec import JobSpec
from argosy.server.store import Store

NODES = [NodeInfo("n0", "cpu", 4), NodeInfo("n1", "cpu", 4)]


class ControlMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        home = Path(self.tmp.name)
        self.config = ServerConfig(home=home, min_cycle_gap_s=0.0)
        self.store = Store(self.config.database_url)
        self.fake = FakeExecutor(NODES)
        self.ctl = self._control()
        self.ids: list[str] = []
        self.final: dict[str, str] = {}

    def _control(self) -> Control:
        ctl = Control(self.config, self.store, self.fake)
        ctl.recover()
        return ctl

    def teardown(self) -> None:
        self.store.close()
        self.tmp.cleanup()

    @rule(nproc=st.integers(1, 5), restarts=st.integers(0, 2), priority=st.integers(0, 2))
    def submit(self, nproc: int, restarts: int, priority: int) -> None:
        spec = JobSpec(
            name="p", script="s.py", nproc_per_node=nproc, max_restarts=restarts, priority=priority
        )
        try:
            row, created = self.ctl.submit(spec, None, "")
        except ArgosyError:
            assert nproc > 4  # only a job no node can hold is refused
            return
        assert created and nproc <= 4
        self.ids.append(row["id"])

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.ctl.cancel(data.draw(st.sampled_from(self.ids)))

    @precondition(lambda self: self.fake.running)
    @rule(data=st.data(), code=st.sampled_from([0, 1, 137, None]))
    def attempt_ends(self, data: st.DataObject, code: int | None) -> None:
        running = [job_id for job_id in self.ids if job_id in self.fake.running]  # ids are
        self.fake.finish(data.draw(st.sampled_from(running)), code)  # random: submit order

    @rule(node=st.sampled_from(["n0", "n1"]), cordoned=st.booleans())
    def cordon(self, node: str, cordoned: bool) -> None:
        self.ctl.set_cordon(node, cordoned)

    @rule()
    def step(self) -> None:
        self.ctl.last_cycle_s = 0.0
        self.ctl.step()

    @rule()
    def server_restarts(self) -> None:
        self.ctl = self._control()

    @invariant()
    def executor_runs_exactly_the_active_jobs(self) -> None:
        rows = {r["id"]: r for r in self.store.jobs_in(ACTIVE)}
        assert self.fake.unreported() == set(rows)  # an exit is applied at the next step
        for job_id, req in self.fake.running.items():
            assert req.attempt == rows[job_id]["attempts"]
        assert set(self.ctl.scheduling.sched.running) == set(rows)  # devices held till then

    @invariant()
    def no_node_holds_more_than_it_has(self) -> None:
        used: dict[str, int] = {}
        for req in self.fake.running.values():
            for node, k in req.nodes.items():
                used[node] = used.get(node, 0) + k
        assert all(used.get(n.name, 0) <= n.devices for n in NODES), used

    @invariant()
    def terminal_states_are_final_and_attempts_bounded(self) -> None:
        for job_id in self.ids:
            row = self.store.get_job(job_id)
            assert row is not None
            if job_id in self.final:
                assert row["state"] == self.final[job_id]
            elif row["state"] in TERMINAL:
                self.final[job_id] = row["state"]
            assert row["attempts"] <= row["spec"]["max_restarts"] + 1


ControlMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
test_control_loop_properties = ControlMachine.TestCase
