"""Elastic jobs beside fixed gangs and tidal services on mixed node sizes and chips
(a hypothesis state machine over `Scheduling`, no processes, a FakeClock crossing the
services' troughs and peaks). After every step:

- no node holds more devices than it has, and the capacity index agrees with what the
  allocations hold on every node in service;
- an allocation names each node once (a node twice is a placement whose dict loses
  devices) and its devices are the sum of its counts;
- an elastic job holds a multiple of `nproc_per_node` devices within
  [min_nnodes, max_nnodes] x nproc_per_node, on nodes of at least `nproc_per_node`
  devices of one group, on at most devices / nproc_per_node nodes;
- an exact gang holds `nnodes` nodes of `nproc_per_node`; a packed fixed gang its
  `nnodes x nproc_per_node` devices on nodes of at least `nproc_per_node`;
- a start, grow or replica never lands on a node out of service;
- a job the scheduler holds is pending or placed, never both;
- a service's replicas are placed and within its replicas count;
- an elastic job is never started by evicting or shrinking work while its minimum fits
  in free devices, and room is made for its minimum only.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tidal_fakes import FAST

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.scheduler import fit
from argosy.scheduler.decisions import Decision
from argosy.scheduler.workload import State, Workload
from argosy.server.scheduling import Scheduling
from argosy.server.service_spec import ServiceSpec, TidalSpec
from argosy.server.spec import JobSpec

SIZES = [1, 2, 4, 8]
PER_NODE = [1, 2, 3, 4, 8]
CHIPS = ["cpu", "h100-sxm"]
PERIOD_S = 120.0


def job_spec(nnodes: int, per_node: int, exact: bool, elastic_to: int, chip: str | None,
             priority: int = 0) -> JobSpec:  # fmt: skip
    body: dict = {
        "name": "g",
        "script": "/bin/true",
        "nnodes": nnodes,
        "nproc_per_node": per_node,
        "exact_nodes": exact,
        "priority": priority,
    }
    if chip:
        body["chips"] = [chip]
    if not exact and elastic_to >= nnodes and elastic_to > 0:
        body["elastic"] = {"min_nnodes": nnodes, "max_nnodes": elastic_to}
    return JobSpec.model_validate(body)


class ElasticTidalMachine(RuleBasedStateMachine):
    @initialize(
        shape=st.lists(
            st.tuples(st.sampled_from(SIZES), st.sampled_from(CHIPS)), min_size=2, max_size=9
        ),
    )
    def cluster(self, shape: list[tuple[int, str]]) -> None:
        self.nodes = [NodeInfo(f"n{i}", chip, d) for i, (d, chip) in enumerate(shape)]
        self.size = {n.name: n.devices for n in self.nodes}
        self.clock = FakeClock(0.0)
        self.scheduling = Scheduling(self.nodes, None, "argosy", FAST, self.clock)
        self.specs: dict[str, JobSpec] = {}
        self.ids: list[str] = []  # submit order
        self.services: dict[str, ServiceSpec] = {}
        self.out: set[str] = set()
        self.placed: dict[str, dict[str, int]] = {}  # job -> placement last seen
        self.replicas: dict[str, list[str]] = {}

    # ---- rules ------------------------------------------------------------------------
    @rule(
        nnodes=st.integers(1, 3),
        per_node=st.sampled_from(PER_NODE),
        exact=st.booleans(),
        elastic_to=st.integers(0, 4),
        chip=st.sampled_from([None, *CHIPS]),
        priority=st.integers(0, 1),
    )
    def submit(self, nnodes, per_node, exact, elastic_to, chip, priority) -> None:
        spec = job_spec(nnodes, per_node, exact, elastic_to, chip, priority)
        if self.scheduling.check(spec)[1]:
            return
        job_id = f"j{len(self.ids)}"
        why = self.scheduling.submit(job_id, spec, self.clock.now_s())
        if why:  # the scheduler's own refusal (beside services' peaks)
            return
        self.specs[job_id] = spec
        self.ids.append(job_id)

    @rule(
        low=st.integers(1, 2),
        extra=st.integers(1, 3),
        per_node=st.sampled_from(PER_NODE),
        chip=st.sampled_from([None, *CHIPS]),
        priority=st.integers(0, 1),
    )
    def submit_elastic(self, low, extra, per_node, chip, priority) -> None:
        self.submit(low, per_node, False, low + extra, chip, priority)

    @rule(
        replicas=st.integers(1, 3),
        levels=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=6),
        lead=st.sampled_from([0.0, 0.5, 1.0]),
        floor=st.integers(0, 2),
        chip=st.sampled_from([None, *CHIPS]),
    )
    def submit_service(self, replicas, levels, lead, floor, chip) -> None:
        if len(self.services) >= 2:
            return
        step_s = PERIOD_S / len(levels)
        tidal = TidalSpec(levels=levels, period_s=PERIOD_S, lead_s=lead * step_s,
                          min_replicas=min(floor, replicas))  # fmt: skip
        spec = ServiceSpec(name="chat", replicas=replicas, tidal=tidal,
                           chips=[chip] if chip else [])  # fmt: skip
        if self.scheduling.check_service(spec)[1]:
            return
        sid = f"s{len(self.services)}"
        if self.scheduling.submit_service(sid, spec, self.clock.now_s()):
            return
        self.services[sid] = spec

    @rule()
    def cycle(self) -> None:
        free = self.scheduling.sched.cap.avail.copy()
        replicas = {sid: self.scheduling.replica_nodes(sid) for sid in self.services}
        decisions = self.scheduling.cycle()
        self._room_only_when_needed(decisions, free, replicas)
        for d in decisions:
            wid = d.workload.id
            if d.action == "replicas":
                nodes = self.scheduling.replica_nodes(wid)
                new = [n for n in nodes if n not in self.replicas.get(wid, [])]
                assert not set(new) & self.out, f"{wid} replicas placed on {new}, out: {self.out}"
                self.replicas[wid] = nodes
                continue
            if d.action == "start":
                placed = self.scheduling.placement(wid).nodes
                assert not set(placed) & self.out, f"{wid} started on {placed}, out {self.out}"
                self.placed[wid] = placed
            elif d.action == "resize":
                placed = self.scheduling.placement(wid).nodes
                gained = {n for n, k in placed.items() if k > self.placed.get(wid, {}).get(n, 0)}
                assert not gained & self.out, f"{wid} grew onto {gained}, out {self.out}"
                self.placed[wid] = placed
            elif d.action == "preempt":
                self.placed.pop(wid, None)

    def _room_only_when_needed(self, decisions: list[Decision], free, replicas) -> None:
        """A start right after a victim of room-making is the start room was made for:
        for an elastic job, its minimum, which did not fit in the devices free before the
        cycle less all the cycle's other starts and new replicas (what was free when room
        was made is at least that)."""
        for i, d in enumerate(decisions):
            w = d.workload
            if d.action != "start" or not w.elastic or i == 0:
                continue
            if not decisions[i - 1].reason.endswith("to make room"):
                continue
            assert d.after == w.min_devices, f"{w.id}: room made for {d.after}, min {w.min_devices}"
            left = self._left_free(decisions[:i], free, replicas)
            if left is not None:
                assert not self._fits(w, left), (
                    f"{w.id} (min {w.min_devices}) started by room-making; it fit in {left}"
                )

    def _left_free(self, earlier: list[Decision], free, replicas):
        """`free` less what `earlier` starts took and the replicas added in the cycle;
        None where a start's devices are no longer known (shrunk in the same cycle)."""
        s = self.scheduling
        left = free.copy()
        for d in earlier:
            if d.action != "start":
                continue
            a = d.workload.alloc
            if a is None or a.devices < d.after:
                return None
            taken = 0
            for node, k in zip(a.nodes.tolist(), a.counts.tolist(), strict=True):
                if taken >= d.after:
                    break
                left[node] -= k
                taken += k
        for sid, before in replicas.items():
            now = s.replica_nodes(sid)
            for name in set(now):
                left[s.index[name]] -= max(0, now.count(name) - before.count(name))
        return left.clip(min=0)

    def _fits(self, w: Workload, left) -> bool:
        """Whether `w`'s minimum has a place (`Capacity.place` with its node unit) in
        `left` free devices per node."""
        cap = self.scheduling.sched.cap
        for chip in w.chips:
            for g in cap.groups(chip, w.min_node):
                s, e = cap.ranges[g]
                avail, d = left[s:e], cap.dpn[g]
                u = fit.node_unit(w, d)
                if w.min_devices < u or w.min_devices == u < d:
                    if (avail >= w.min_devices).any():
                        return True
                elif int((avail == d).sum()) >= -(-w.min_devices // u):
                    return True
        return False

    @rule(seconds=st.sampled_from([1.0, 7.0, 15.0, 30.0, 60.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(seconds=st.sampled_from([5.0, 10.0, 20.0]))
    def tick(self, seconds: float) -> None:
        """Time passes and the loop cycles (the usual pair)."""
        self.clock.advance(seconds)
        self.cycle()

    @precondition(lambda self: self.placed)
    @rule(data=st.data(), lost=st.booleans())
    def attempt_ends(self, data: st.DataObject, lost: bool) -> None:
        running = [j for j in self.ids if j in self.placed]
        job_id = data.draw(st.sampled_from(running))
        del self.placed[job_id]
        if lost:
            self.scheduling.requeue(job_id)
        else:
            self.scheduling.finished(job_id)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.ids))
        self.placed.pop(job_id, None)
        self.scheduling.finished(job_id)

    @rule(data=st.data(), in_service=st.booleans())
    def node_service(self, data: st.DataObject, in_service: bool) -> None:
        name = data.draw(st.sampled_from([n.name for n in self.nodes]))
        self.scheduling.set_in_service(name, in_service)
        (self.out.discard if in_service else self.out.add)(name)

    @precondition(lambda self: self.services)
    @rule(data=st.data())
    def remove_service(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(list(self.services)))
        self.scheduling.remove_service(sid)
        self.replicas.pop(sid, None)
        del self.services[sid]

    # ---- invariants -------------------------------------------------------------------
    def _allocs(self):
        sched = self.scheduling.sched
        for w in sched.running.values():
            if w.alloc is not None:
                yield w.id, w.alloc
        for w in sched.services:
            for a in w.replicas:
                yield w.id, a

    @invariant()
    def allocations_are_well_formed_and_fit(self) -> None:
        s = self.scheduling
        used: dict[int, int] = {}
        for wid, a in self._allocs():
            nodes = [int(i) for i in a.nodes]
            if wid in self.specs:  # a job's allocation: one entry per node
                assert len(set(nodes)) == len(nodes), f"{wid} names a node twice: {a}"
            assert int(a.counts.sum()) == a.devices, f"{wid}: devices {a.devices} != {a.counts}"
            assert (a.counts > 0).all(), f"{wid}: empty entry {a}"
            for i, k in zip(nodes, a.counts.tolist(), strict=True):
                assert int(s.sched.cap.group[i]) == a.group, f"{wid} spans groups: {a}"
                used[i] = used.get(i, 0) + k
        for i, k in used.items():
            assert k <= s.nodes[i].devices, f"{s.nodes[i].name} holds {k} > {s.nodes[i].devices}"
        cap = s.sched.cap
        for i, n in enumerate(s.nodes):
            if n.name in self.out:
                continue
            want = n.devices - used.get(i, 0)
            assert int(cap.avail[i]) == want, (
                f"{n.name}: capacity index says {int(cap.avail[i])} free, allocations leave {want}"
            )

    @invariant()
    def every_job_has_its_shape(self) -> None:
        s = self.scheduling
        for job_id, w in s.sched.running.items():
            if job_id not in self.specs:
                continue
            spec = self.specs[job_id]
            placed = s.placement(job_id).nodes
            per = spec.nproc_per_node
            devices = sum(placed.values())
            assert devices == w.alloc.devices, f"{job_id}: placement {placed} != {w.alloc}"
            sizes = {self.size[n] for n in placed}
            assert len(sizes) == 1, f"{job_id} spans node sizes: {placed}"
            assert min(sizes) >= per, f"{job_id} ({per}/node) on smaller nodes: {placed}"
            if spec.exact_nodes:
                assert len(placed) == spec.nnodes and set(placed.values()) == {per}, (
                    job_id, placed)  # fmt: skip
            elif spec.elastic:
                low, high = spec.device_range
                assert devices % per == 0, (
                    f"{job_id} elastic {spec.elastic.min_nnodes}..{spec.elastic.max_nnodes} x "
                    f"{per}: holds {devices} devices, not whole nodes of {per}: {placed}"
                )
                assert low <= devices <= high, f"{job_id}: {devices} outside {low}..{high}"
                assert len(placed) <= devices // per, f"{job_id}: too many nodes {placed}"
            else:
                assert devices == spec.nnodes * per, (job_id, placed)
                assert len(placed) <= spec.nnodes, (job_id, placed)

    @invariant()
    def pending_or_placed(self) -> None:
        sched = self.scheduling.sched
        for job_id, w in self.scheduling.workloads.items():
            if job_id not in self.specs:
                continue
            pending, running = w in sched.pending, job_id in sched.running
            assert not (pending and running), f"{job_id} pending and running"
            assert pending or running, f"{job_id} held but neither pending nor running ({w.state})"
            assert (w.state == State.RUNNING) == running, (job_id, w.state)
            assert (w.alloc is not None) == running, (job_id, w.alloc)

    @invariant()
    def services_within_their_count(self) -> None:
        for sid, spec in self.services.items():
            nodes = self.scheduling.replica_nodes(sid)
            assert len(nodes) <= spec.replicas, (sid, nodes)


ElasticTidalMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ARGOSY_MACHINE_EXAMPLES", "300")),
    stateful_step_count=int(os.environ.get("ARGOSY_MACHINE_STEPS", "50")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
test_elastic_tidal_machine = ElasticTidalMachine.TestCase
