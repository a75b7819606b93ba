"""The control loop (real `Control`, store, scheduler and lease; `FakeExecutor`, a
fake replica admin and a `FakeClock`) with elastic jobs beside fixed and exact gangs
and tidal services on mixed node sizes, through clock advances across the forecast's
troughs and peaks, attempts that end or are lost, replicas that die, cordons, nodes
lost and back, cancels, and server restarts (a new `Control` on the same store and
executor, `recover()`). Checked after every control step:

- no node runs more ranks plus awake replicas than it has devices;
- an elastic job's attempt runs a multiple of `nproc_per_node` within its range, on
  nodes of at least `nproc_per_node`, on at most devices / nproc_per_node nodes; an exact
  gang its exact shape; a packed gang its devices on at most `nnodes` nodes;
- no attempt of a job starts on a node cordoned or lost at that moment;
- the executor runs exactly the jobs the store calls active (less those stopped for a
  resize and not yet relaunched), the scheduler holds exactly the active jobs as running
  and the pending ones as pending;
- a service's awake replicas sit where the scheduler placed them, within its count;
- a terminal state is final; a job fails for used-up restarts only after more losses
  than `max_restarts`;
- a restart recovers what the scheduler held (running placements, pending, replicas;
  a replica slot on a lost node may move to a node in service, and none is placed onto
  a lost node), and leaves no slot on a lost node while a device in service is free
  (also after a node lost while the server was down).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tidal_fakes import FAST
from tidal_fakes import InstantAdmin as FakeAdmin

from argosy.core.clock import FakeClock
from argosy.core.errors import ArgosyError
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.config import ServerConfig
from argosy.server.control import Control
from argosy.server.schemas import ACTIVE, TERMINAL
from argosy.server.service_spec import ServiceSpec, TidalSpec
from argosy.server.services import is_replica
from argosy.server.spec import JobSpec
from argosy.server.store import Store
from argosy.server.tidal import HOLDING

SIZES = [1, 2, 4]
PER_NODE = [1, 2, 3, 4]
PERIOD_S = 120.0


class ElasticControlMachine(RuleBasedStateMachine):
    @initialize(sizes=st.lists(st.sampled_from(SIZES), min_size=2, max_size=5))
    def cluster(self, sizes: list[int]) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.nodes = [NodeInfo(f"n{i}", "cpu", d) for i, d in enumerate(sizes)]
        self.size = {n.name: n.devices for n in self.nodes}
        self.config = ServerConfig(home=Path(self.tmp.name), min_cycle_gap_s=0.0,
                                   nodes_interval_s=1e9, scheduler=FAST)  # fmt: skip
        self.store = Store(self.config.database_url)
        self.fake = FakeExecutor(list(self.nodes))
        self.clock = FakeClock(0.0)
        self.ctl = self._control()
        self.ids: list[str] = []
        self.specs: dict[str, JobSpec] = {}
        self.services: list[str] = []
        self.final: dict[str, str] = {}
        self.losses: dict[str, int] = {}
        self.seen_starts = 0
        self.last_nodes: dict[str, dict[str, int]] = {}

    def _control(self) -> Control:
        ctl = Control(self.config, self.store, self.fake, clock=self.clock, admin=FakeAdmin(),
                      probe=lambda url: True)  # fmt: skip
        ctl.services.health_interval_s = 0.0
        ctl.recover()
        return ctl

    def teardown(self) -> None:
        if hasattr(self, "ctl"):
            self.ctl.services.close()
            self.store.close()
            self.tmp.cleanup()

    # ---- driving the loop -------------------------------------------------------------
    def _step(self) -> None:
        self.ctl.poke()
        self.ctl.last_cycle_s = 0.0
        self.ctl.step()
        for call in list(self.ctl.lease.calls.values()):
            call.future.result(timeout=10)
        for probe in list(self.ctl.services._probes.values()):  # noqa: SLF001
            probe.result(timeout=10)
        self._check_step()

    def _settle(self) -> None:
        for _ in range(5):
            self._step()

    # ---- rules ------------------------------------------------------------------------
    def _submit(self, spec: JobSpec) -> None:
        try:
            row, _ = self.ctl.submit(spec, None, "")
        except ArgosyError:
            return
        self.ids.append(row["id"])
        self.specs[row["id"]] = spec
        self._step()

    @rule(
        low=st.integers(1, 2),
        extra=st.integers(1, 3),
        per_node=st.sampled_from(PER_NODE),
        restarts=st.integers(0, 2),
    )
    def submit_elastic(self, low: int, extra: int, per_node: int, restarts: int) -> None:
        elastic = {"min_nnodes": low, "max_nnodes": low + extra}
        self._submit(JobSpec.model_validate({
            "name": "e", "script": "t.py", "nnodes": low, "nproc_per_node": per_node,
            "elastic": elastic, "max_restarts": restarts,
        }))  # fmt: skip

    @rule(
        nnodes=st.integers(1, 3),
        per_node=st.sampled_from(PER_NODE),
        exact=st.booleans(),
        restarts=st.integers(0, 2),
        priority=st.integers(0, 1),
    )
    def submit_gang(self, nnodes: int, per_node: int, exact: bool, restarts: int,
                    priority: int) -> None:  # fmt: skip
        self._submit(JobSpec.model_validate({
            "name": "g", "script": "t.py", "nnodes": nnodes, "nproc_per_node": per_node,
            "exact_nodes": exact, "max_restarts": restarts, "priority": priority,
        }))  # fmt: skip

    @precondition(lambda self: len(self.services) < 2)
    @rule(
        replicas=st.integers(1, 3),
        levels=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=3, max_size=6),
        lead=st.sampled_from([0.0, 0.5, 1.0]),
        floor=st.integers(0, 1),
    )
    def submit_service(self, replicas: int, levels: list[float], lead: float, floor: int) -> None:
        step_s = PERIOD_S / len(levels)
        tidal = TidalSpec(levels=levels, period_s=PERIOD_S, lead_s=lead * step_s,
                          min_replicas=min(floor, replicas))  # fmt: skip
        try:
            row = self.ctl.submit_service(ServiceSpec(name="chat", replicas=replicas, tidal=tidal))
        except ArgosyError:
            return
        self.services.append(row["id"])
        self._step()

    @rule()
    def step(self) -> None:
        self._step()

    @rule()
    def settle(self) -> None:
        self._settle()

    @rule(seconds=st.sampled_from([5.0, 10.0, 20.0, 40.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._step()
        self._step()

    @precondition(lambda self: any(j in self.fake.running for j in self.ids))
    @rule(data=st.data(), code=st.sampled_from([0, 1, None, 137]))
    def attempt_ends(self, data: st.DataObject, code: int | None) -> None:
        running = [j for j in self.ids if j in self.fake.running]
        job_id = data.draw(st.sampled_from(running))
        if code is None or code == 137:
            self.losses[job_id] = self.losses.get(job_id, 0) + 1
        self.fake.finish(job_id, code)

    @precondition(lambda self: any(is_replica(k) for k in self.fake.running))
    @rule(data=st.data())
    def replica_dies(self, data: st.DataObject) -> None:
        keys = [  # in submit order: service ids are random
            k for s in self.services for k in sorted(self.fake.running) if k.startswith(s + ".r")
        ]
        if keys:
            self.fake.finish(data.draw(st.sampled_from(keys)), None)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.ctl.cancel(data.draw(st.sampled_from(self.ids)))
        self._step()

    @precondition(lambda self: self.services)
    @rule(data=st.data())
    def delete_service(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.services))
        self.ctl.delete_service(sid)
        self._step()

    @rule(data=st.data(), cordoned=st.booleans())
    def cordon(self, data: st.DataObject, cordoned: bool) -> None:
        name = data.draw(st.sampled_from([n.name for n in self.nodes]))
        self.ctl.set_cordon(name, cordoned)
        self._step()

    @rule(data=st.data())
    def node_lost(self, data: st.DataObject) -> None:
        alive = [n for n in self.nodes if n in self.fake.nodes]
        if len(alive) <= 1:
            return
        node = data.draw(st.sampled_from(alive))
        self.fake.nodes.remove(node)
        for key, req in list(self.fake.running.items()):  # its attempts die with it
            if node.name in req.nodes:
                if not is_replica(key):
                    self.losses[key] = self.losses.get(key, 0) + 1
                rank = list(req.nodes).index(node.name)
                self.fake.finish(key, None, (rank,))
        self.ctl._check_nodes()  # noqa: SLF001  (the loop's inventory read)

    @rule(data=st.data())
    def node_lost_while_down(self, data: st.DataObject) -> None:
        """A node is lost while the server is down: the new one finds its attempts ended
        and the node gone from the inventory."""
        self.ctl.services.close()
        alive = [n for n in self.nodes if n in self.fake.nodes]
        if len(alive) > 1:
            node = data.draw(st.sampled_from(alive))
            self.fake.nodes.remove(node)
            for key, req in list(self.fake.running.items()):
                if node.name in req.nodes:
                    if not is_replica(key):
                        self.losses[key] = self.losses.get(key, 0) + 1
                    self.fake.finish(key, None, (list(req.nodes).index(node.name),))
        self.ctl = self._control()
        self._no_replica_slot_on_lost_beside_free()
        self._check_step()

    @precondition(lambda self: len(self.fake.nodes) < len(self.nodes))
    @rule(data=st.data())
    def node_back(self, data: st.DataObject) -> None:
        gone = [n for n in self.nodes if n not in self.fake.nodes]
        node = data.draw(st.sampled_from(gone))
        self.fake.nodes.append(node)
        self.ctl._check_nodes()  # noqa: SLF001
        self._step()

    @rule()
    def server_restarts(self) -> None:
        before = self._held()
        quiet = not self.fake._exits and not self.ctl.lease.resizes  # noqa: SLF001
        self.ctl.services.close()
        self.ctl = self._control()
        after = self._held()
        self._no_replica_slot_on_lost_beside_free()
        if quiet and self.ctl.lost:  # a slot on a lost node may move to one in service
            self._replicas_kept_or_moved_off_lost(before.pop("replicas"), after.pop("replicas"))
        if quiet:
            assert after == before, f"restart changed what the scheduler holds:\n{before}\n{after}"
        self._check_step()

    def _no_replica_slot_on_lost_beside_free(self) -> None:
        """After a restart no replica slot is on a lost node while a device in service is
        free (the replicas there ended with their node: they start again elsewhere)."""
        s = self.ctl.scheduling
        free = {n: s.free_on(n) for n in s.index if n not in s.out_of_service and s.free_on(n)}
        for sid in self.ctl.services.active:
            on_lost = [n for n in s.replica_nodes(sid) if n in self.ctl.lost]
            assert not (on_lost and free), (
                f"{sid}: replica slots on lost {on_lost} after a restart; free in service {free}"
            )

    def _replicas_kept_or_moved_off_lost(self, before: dict, after: dict) -> None:
        """After a quiet restart each replica slot is where it was, but one on a lost node
        may be on a node in service now; no slot is placed onto a lost node."""
        lost = self.ctl.lost
        assert before.keys() == after.keys(), (before, after)
        for sid, was in before.items():
            now = after[sid]
            assert len(now) == len(was), f"{sid}: slots {was} -> {now} (lost {lost})"
            for i, (old, new) in enumerate(zip(was, now, strict=True)):
                assert new == old or (old in lost and new not in lost), (
                    f"{sid} slot {i}: {old} -> {new} (lost {lost})"
                )

    # ---- checks -----------------------------------------------------------------------
    def _held(self) -> dict[str, Any]:
        s = self.ctl.scheduling
        running = {j: dict(s.placement(j).nodes) for j in sorted(s.sched.running)}
        pending = sorted(w.id for shape in s.sched.pending.by_shape.values() for w in shape)
        replicas = {sid: s.replica_nodes(sid) for sid in sorted(self.ctl.services.active)}
        return {"running": running, "pending": pending, "replicas": replicas}

    def _check_step(self) -> None:
        ctl, fake = self.ctl, self.fake
        # new job attempts never start on a node out of service
        out = ctl.cordoned | ctl.lost
        for job_id, attempt in fake.started[self.seen_starts :]:
            if is_replica(job_id) or job_id not in fake.running:
                continue
            req = fake.running[job_id]
            if req.attempt == attempt:
                # a node it held in its last attempt may be kept (a cordon keeps what runs);
                # a lost node, or one out of service it did not hold, never
                new = set(req.nodes) - set(self.last_nodes.get(job_id, {}))
                bad = (new & out) | (set(req.nodes) & ctl.lost)
                assert not bad, (
                    f"{job_id} attempt {attempt} started on {req.nodes} (last attempt on "
                    f"{self.last_nodes.get(job_id)}); cordoned {ctl.cordoned}, lost {ctl.lost}"
                )
        self.seen_starts = len(fake.started)
        for key, req in fake.running.items():
            if not is_replica(key):
                self.last_nodes[key] = dict(req.nodes)
        # devices: ranks + awake replicas per node
        used: dict[str, int] = {}
        for key, req in fake.running.items():
            if is_replica(key):
                continue
            for node, k in req.nodes.items():
                used[node] = used.get(node, 0) + k
            self._shape(key, req.nodes)
        for row in ctl.services.active.values():
            for rec in row["replicas"]:
                if rec["state"] in HOLDING and rec.get("node"):
                    used[rec["node"]] = used.get(rec["node"], 0) + 1
        over = {n: k for n, k in used.items() if k > self.size[n]}
        assert not over, f"nodes over their devices: {over} (sizes {self.size})"

    def _shape(self, job_id: str, nodes: dict[str, int]) -> None:
        spec = self.specs[job_id]
        per, devices = spec.nproc_per_node, sum(nodes.values())
        assert min(self.size[n] for n in nodes) >= per, f"{job_id} ({per}/node) on {nodes}"
        if spec.exact_nodes:
            assert len(nodes) == spec.nnodes and set(nodes.values()) == {per}, (job_id, nodes)
        elif spec.elastic:
            low, high = spec.device_range
            assert devices % per == 0 and low <= devices <= high, (
                f"{job_id} elastic {spec.elastic.min_nnodes}..{spec.elastic.max_nnodes} x {per} "
                f"runs on {nodes}"
            )
            assert len(nodes) <= devices // per, (job_id, nodes)
        else:
            assert devices == spec.nnodes * per and len(nodes) <= spec.nnodes, (job_id, nodes)

    @invariant()
    def executor_scheduler_and_store_agree(self) -> None:
        if self.fake._exits:  # noqa: SLF001  an exit is taken in at the next step
            return
        ctl = self.ctl
        rows = {r["id"]: r for r in self.store.jobs_in(ACTIVE)}
        waiting = {j for j in rows if ctl.lease.waiting(j)}
        jobs_running = {k for k in self.fake.running if not is_replica(k)}
        assert jobs_running == set(rows) - waiting, (
            f"executor runs {sorted(jobs_running)}; store active {sorted(rows)}, "
            f"waiting to relaunch {sorted(waiting)}"
        )
        sched = ctl.scheduling.sched
        assert set(sched.running) == set(rows), (
            f"scheduler runs {sorted(sched.running)}, store active {sorted(rows)}"
        )
        pending_rows = {r["id"] for r in self.store.jobs_in(["pending"])}
        pending = {w.id for ws in sched.pending.by_shape.values() for w in ws}
        assert pending == pending_rows, f"scheduler pending {pending}, store {pending_rows}"

    @invariant()
    def services_awake_where_placed(self) -> None:
        for sid, row in self.ctl.services.active.items():
            spec = ServiceSpec.model_validate(row["spec"])
            holding = [r for r in row["replicas"] if r["state"] in HOLDING]
            assert len(holding) <= spec.replicas, (sid, row["replicas"])
            wanted = self.ctl.scheduling.replica_nodes(sid)
            assert len(wanted) <= spec.replicas, (sid, wanted)

    @invariant()
    def terminal_final_and_losses_counted(self) -> None:
        for job_id in self.ids:
            row = self.store.get_job(job_id)
            assert row is not None
            if job_id in self.final:
                assert row["state"] == self.final[job_id], (job_id, row["state"], row["reason"])
            elif row["state"] in TERMINAL:
                self.final[job_id] = row["state"]
                if "used up" in (row["reason"] or ""):
                    lost = self.losses.get(job_id, 0)
                    assert lost > row["spec"]["max_restarts"], (
                        f"{job_id} failed with {lost} loss(es), max_restarts "
                        f"{row['spec']['max_restarts']}: {row['reason']}"
                    )


ElasticControlMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ARGOSY_MACHINE_EXAMPLES", "100")),
    stateful_step_count=int(os.environ.get("ARGOSY_MACHINE_STEPS", "30")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
test_elastic_control_machine = ElasticControlMachine.TestCase


def test_a_job_waits_for_a_replica_still_holding_a_device_the_scheduler_gave_out() -> None:
    """At the trough a tidal service shrinks: the scheduler frees its replica's device in
    the cycle, but the replica holds it until it is asleep. A job placed there in that
    window goes back to pending (it had started on a node already full)."""
    machine = ElasticControlMachine()
    try:
        machine.cluster(sizes=[1, 1])
        machine.submit_service(floor=0, lead=0.0, levels=[0.5, 0.0, 0.0], replicas=1)
        machine.server_restarts()
        machine.tick(seconds=40.0)
        machine.submit_elastic(extra=1, low=1, per_node=1, restarts=0)  # checks every step
        machine.settle()
        assert machine.ctl.scheduling.sched.running, "the job starts once the replica sleeps"
    finally:
        machine.teardown()


class _Pick:
    """A stand-in for hypothesis' `data` that draws the named node."""

    def __init__(self, name: str) -> None:
        self.name = name

    def draw(self, strategy: Any) -> Any:
        return next(n for n in strategy.elements if n.name == self.name)


def test_a_restart_gives_no_slot_on_a_lost_node_to_a_replica_that_held_none() -> None:
    """At the trough replica 1 sleeps on n1, its device lent; n1 is lost (the asleep
    replica with it). When the forecast wants it again no device is free, so the
    scheduler holds one slot. A restart handed replica 1 its record's node, the lost n1:
    a slot there holds no device, yet counts as a replica."""
    machine = ElasticControlMachine()
    try:
        machine.cluster(sizes=[1, 1])
        machine.submit_service(floor=0, lead=0.0, levels=[1.0, 0.5, 0.0], replicas=2)
        machine.settle()
        machine.tick(seconds=40.0)
        (sid,) = machine.services
        asleep = [r["node"] for r in machine.ctl.services.active[sid]["replicas"]
                  if r["state"] == "asleep"]  # fmt: skip
        assert len(asleep) == 1
        machine.node_lost(_Pick(asleep[0]))
        machine.tick(seconds=40.0)  # the forecast wants two again; one device is left
        assert len(machine.ctl.scheduling.replica_nodes(sid)) == 1
        machine.server_restarts()  # checks the slots against those before the restart
        assert machine.ctl.scheduling.replica_nodes(sid) == [n for n in ("n0", "n1")
                                                             if n != asleep[0]]  # fmt: skip
    finally:
        machine.teardown()
