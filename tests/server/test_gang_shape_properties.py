"""Every gang the scheduler starts has the shape its job asked for, on a busy cluster of
mixed node sizes (hypothesis state machine over `Scheduling`, no processes): random
submits, cycles, ends, lost attempts and nodes taken out of service, the shape checked
after every step.

- an exact gang runs on `nnodes` distinct nodes with `nproc_per_node` devices each;
- a packed gang runs in one node group, on nodes of at least `nproc_per_node` devices,
  so never on more than `nnodes` nodes (more only while its big nodes are busy was the
  bug: a packed 2 x 4 spread over eight 1-device nodes);
- no node holds more than it has, and a node out of service gets no new gang.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.scheduler.config import SchedulerConfig
from argosy.server.scheduling import Scheduling
from argosy.server.spec import JobSpec

SIZES = [1, 2, 4, 8]


def _spec(nnodes: int, per_node: int, exact: bool, elastic_to: int) -> JobSpec:
    body: dict = {
        "name": "g",
        "script": "/bin/true",
        "nnodes": nnodes,
        "nproc_per_node": per_node,
        "exact_nodes": exact,
    }
    if not exact and elastic_to > nnodes:
        body["elastic"] = {"min_nnodes": nnodes, "max_nnodes": elastic_to}
    return JobSpec.model_validate(body)


class GangShapeMachine(RuleBasedStateMachine):
    @initialize(sizes=st.lists(st.sampled_from(SIZES), min_size=2, max_size=10))
    def cluster(self, sizes: list[int]) -> None:
        self.nodes = [NodeInfo(f"n{i}", "cpu", d) for i, d in enumerate(sizes)]
        self.size = {n.name: n.devices for n in self.nodes}
        self.scheduling = Scheduling(self.nodes, None, "argosy", SchedulerConfig(), FakeClock())
        self.specs: dict[str, JobSpec] = {}
        self.running: dict[str, dict[str, int]] = {}
        self.out: set[str] = set()

    @rule(
        nnodes=st.integers(1, 4),
        per_node=st.sampled_from([1, 2, 3, 4, 8]),
        exact=st.booleans(),
        elastic_to=st.integers(0, 6),
    )
    def submit(self, nnodes: int, per_node: int, exact: bool, elastic_to: int) -> None:
        spec = _spec(nnodes, per_node, exact, elastic_to)
        if self.scheduling.check(spec)[1]:
            return
        job_id = f"j{len(self.specs)}"
        assert self.scheduling.submit(job_id, spec, 0.0) == ""
        self.specs[job_id] = spec

    @rule()
    def cycle(self) -> None:
        for d in self.scheduling.cycle():
            job_id = d.workload.id
            if d.action == "start":
                placed = self.scheduling.placement(job_id).nodes
                assert not set(placed) & self.out, f"{job_id} started on {placed}, out: {self.out}"
                self.running[job_id] = placed
            elif job_id in self.running:  # preempted or resized: its placement now
                w = self.scheduling.workloads[job_id]
                if w.alloc is None:
                    del self.running[job_id]
                else:
                    self.running[job_id] = self.scheduling.placement(job_id).nodes

    @precondition(lambda self: self.running)
    @rule(data=st.data(), lost=st.booleans())
    def attempt_ends(self, data: st.DataObject, lost: bool) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[job_id]
        if lost:
            self.scheduling.requeue(job_id)
        else:
            self.scheduling.finished(job_id)

    @rule(data=st.data(), in_service=st.booleans())
    def node_service(self, data: st.DataObject, in_service: bool) -> None:
        name = data.draw(st.sampled_from([n.name for n in self.nodes]))
        self.scheduling.set_in_service(name, in_service)
        (self.out.discard if in_service else self.out.add)(name)

    @invariant()
    def every_gang_has_its_shape(self) -> None:
        for job_id, placed in self.running.items():
            spec = self.specs[job_id]
            per_node, sizes = spec.nproc_per_node, {self.size[n] for n in placed}
            assert len(sizes) == 1, f"{job_id} spans node sizes: {placed}"
            if spec.exact_nodes:
                assert len(placed) == spec.nnodes, (job_id, placed)
                assert set(placed.values()) == {per_node}, (job_id, placed)
                continue
            assert min(sizes) >= per_node, f"{job_id} ({spec.nnodes} x {per_node}) on {placed}"
            devices = sum(placed.values())
            assert len(placed) <= math.ceil(devices / per_node), (job_id, placed)

    @invariant()
    def no_node_holds_more_than_it_has(self) -> None:
        used: dict[str, int] = {}
        for placed in self.running.values():
            for name, k in placed.items():
                used[name] = used.get(name, 0) + k
        assert all(k <= self.size[name] for name, k in used.items()), used


GangShapeMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
test_gang_shape_properties = GangShapeMachine.TestCase


def test_an_exact_gang_is_not_answered_for_by_a_packed_one_of_the_same_size() -> None:
    """Two 4-device nodes with 2 devices free on each: a packed 1 x 4 has no place, an
    exact 2 x 2 has one. Both ask for 4 devices of the same queue and chips; the exact
    one, submitted second, starts (it had shared the packed one's pending shape, whose
    head had no place)."""
    nodes = [NodeInfo("n0", "cpu", 4), NodeInfo("n1", "cpu", 4)]
    scheduling = Scheduling(nodes, None, "argosy", SchedulerConfig(), FakeClock())
    for job_id in ("pair0", "pair1"):
        assert scheduling.submit(job_id, _spec(2, 1, True, 0), 0.0) == ""
    assert {d.workload.id for d in scheduling.cycle() if d.action == "start"} == {"pair0", "pair1"}
    assert scheduling.submit("packed", _spec(1, 4, False, 0), 1.0) == ""
    assert scheduling.submit("exact", _spec(2, 2, True, 0), 2.0) == ""
    started = [d.workload.id for d in scheduling.cycle() if d.action == "start"]
    assert started == ["exact"], started
    assert scheduling.placement("exact").nodes == {"n0": 2, "n1": 2}
