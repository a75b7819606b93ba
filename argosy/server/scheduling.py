"""The scheduler library on the real clock: an adapter from jobs to workloads and back.

The server keeps one `Scheduler` (argosy.scheduler) over a cluster model built from the
executor's inventory, feeds it submitted jobs, and receives its decisions. This module
translates both ways (job spec -> `Workload`, `Allocation` -> node names) and does the
few bookkeeping steps the server needs that the simulator does not: re-admitting the
attempts that survived a server restart on their old devices, and taking nodes out of
placement (cordon, node lost) without touching the jobs on them.

    scheduling = Scheduling(executor.inventory(), None, "argosy", SchedulerConfig())
    scheduling.submit("j1", spec, submit_s=time.time())   # "" or the reason it never fits
    for d in scheduling.cycle(): ...                       # start / preempt decisions

Tidal sharing: a service's `tidal` forecast becomes its workload's profile (each level
raised to the highest level of the next `lead_s`, so the scheduler's target is awake
`lead_s` before a rise), and an elastic job's node range its min/max devices; the
scheduler then lends idle replicas' devices to elastic jobs (`resize`, `replicas`
decisions) and `argosy.server.tidal` carries them out. On the server a resize costs
what this machine's relaunch costs (`resize_cost_s` of the config, not the policy's
10,000-rank budget), and an elastic job never grows past its `max_nnodes`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from argosy.core.clock import Clock
from argosy.core.errors import UnknownNameError
from argosy.executors.base import NodeInfo
from argosy.hardware.catalog import default_catalog
from argosy.hardware.cluster import ClusterSpec, NodeGroupSpec, resolve
from argosy.scheduler import elastic, fit
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.core import Scheduler
from argosy.scheduler.decisions import Decision
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, QueueSpec, QuotaSpec, build_tree, load_queues
from argosy.scheduler.workload import Allocation, State, Workload
from argosy.server.schemas import Placement
from argosy.server.service_spec import ServiceSpec
from argosy.server.spec import JobSpec


class Scheduling:
    """The live scheduler and the mapping between its indices and the executor's names."""

    def __init__(
        self,
        inventory: list[NodeInfo],
        queues_file: Path | None,
        policy: str,
        config: SchedulerConfig,
        clock: Clock,
    ) -> None:
        self.nodes = sorted(inventory, key=lambda n: (n.chip, n.devices, n.name))
        self.cluster = resolve(_cluster_spec(self.nodes))
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        tree = (
            load_queues(queues_file, self.cluster)
            if queues_file
            else build_tree(_default_queues(self.cluster.devices_by_chip()), self.cluster)
        )
        chosen = policies.get(policy)
        # a resize costs what a relaunch costs here: config.resize_cost_s
        runtime = dataclasses.replace(chosen.runtime, resize_s=0.0, resize_model=None)
        chosen = dataclasses.replace(chosen, hot_spares=False, runtime=runtime)
        config = config.model_copy(update={"elastic_overgrow": 1.0, "forecast_lead_s": 0.0})
        self.sched = Scheduler(self.cluster, tree, chosen, config, clock)
        self.workloads: dict[str, Workload] = {}
        self.out_of_service: set[str] = set()

    # ---- requests --------------------------------------------------------------------
    def check(self, spec: JobSpec) -> tuple[str, str]:
        """Why `spec` can never run here, and the field to change (("", "") if it may):
        unknown queue or chip; no node group (one chip, one node size) with room for its
        gang (exact: `nnodes` nodes of `nproc_per_node` devices; packed: its devices on
        at most `nnodes` nodes of at least `nproc_per_node` devices, so a job never gets
        more nodes than it asked for only because none is big enough); or what the
        scheduler would reject at once (quota ceilings, pinned reservations): refused at
        submit, not stored and failed."""
        field, why = self._gang_check(spec)
        if not why:
            why = fit.never_fits(self.sched, self._workload("", spec, 0.0))
            field = "nnodes" if why else ""
        return ("elastic.min_nnodes" if field == "nnodes" and spec.elastic else field), why

    def _gang_check(self, spec: JobSpec) -> tuple[str, str]:
        """`check` less what the scheduler's own submit rejects (`fit.never_fits`)."""
        field, why, usable = self._names_check(spec.queue, spec.chips)
        if why:
            return field, why
        nnodes = spec.elastic.min_nnodes if spec.elastic else spec.nnodes
        per_node = spec.nproc_per_node
        groups = [g for c in usable for g in self._node_groups(c, per_node)]
        if spec.exact_nodes:
            biggest = max(groups, key=lambda g: (len(g), g[0].devices), default=[])
            if len(biggest) < nnodes:
                return "nnodes", (
                    f"needs {nnodes} node(s) with {per_node} device(s) each in one node group "
                    f"(one chip, one node size); {_largest_gang_text(biggest, usable)}"
                )
            return "", ""
        need = nnodes * per_node
        roomiest = max(groups, key=lambda g: sum(n.devices for n in g), default=[])
        if sum(n.devices for n in roomiest) < need:
            return "nnodes", (
                f"needs {need} devices on at most {nnodes} node(s) of at least {per_node} "
                f"device(s) in one node group (one chip, one node size); "
                f"{_roomiest_text(roomiest, usable)}"
            )
        return "", ""

    def check_service(self, spec: ServiceSpec) -> tuple[str, str]:
        """Why a service can never run here, and the field to change (("", "") if it may)."""
        field, why, _ = self._names_check(spec.queue, spec.chips)
        if why:
            return field, why
        have = self.cluster.devices_by_chip()
        usable = sum(have.get(default_catalog().canonical(c), 0) for c in spec.chips or have)
        if spec.replicas > usable:
            why = f"needs {spec.replicas} devices (one per replica); the cluster has {usable}"
            return "replicas", why
        return "", ""

    def _names_check(self, queue: str, accepted: list[str]) -> tuple[str, str, list[str]]:
        """(field, why, the accepted chips the cluster has): an unknown queue or chip,
        or no chip the request accepts."""
        tree = self.sched.tree
        if queue not in tree.leaves:
            return "queue", tree.leaf_error(queue), []
        have = self.cluster.devices_by_chip()
        chips = []
        for name in accepted or list(have):
            try:
                chips.append(default_catalog().canonical(name))
            except UnknownNameError as err:
                return "chips", str(err), []
        usable = [c for c in chips if c in have]
        if not usable:
            return "chips", f"accepts chip types {chips}; the cluster has {list(have)}", []
        return "", "", usable

    def _node_groups(self, chip: str, per_node: int) -> list[list[NodeInfo]]:
        """The nodes of each node group of `chip` (one node size: a gang never spans
        two) whose nodes have at least `per_node` devices."""
        by_size: dict[int, list[NodeInfo]] = {}
        for n in self.nodes:
            if n.chip == chip and n.devices >= per_node:
                by_size.setdefault(n.devices, []).append(n)
        return list(by_size.values())

    def submit(self, job_id: str, spec: JobSpec, submit_s: float) -> str:
        """Queue the job; returns "" or the reason it can never run here (`check`'s: a
        job queued again after a restart or a forgotten node is judged as at submit)."""
        why = self._gang_check(spec)[1]  # the rest of `check` is the scheduler's reject
        if why:
            return why
        w = self._workload(job_id, spec, submit_s)
        decision = self.sched.submit(w)
        if decision is not None and decision.action == "reject":
            return decision.reason
        self.workloads[job_id] = w
        return ""

    def restore_past_use(self, holds_since: Callable[[float], list[dict]], now: float) -> None:
        """The queues' decayed use, rebuilt from what held devices (`holds_since(t)`: rows
        of queue, placement, start and end (None: held still) of every hold after t, 20
        half-lives back), so a restarted server still puts a queue that flooded the
        cluster after one that did not, as it did before the restart."""
        tree = self.sched.tree
        for row in holds_since(now - 20 * tree.half_life_s):
            placement = Placement.model_validate(row["placement"])
            devices = sum(placement.nodes.values())
            end = row["end"] if row["end"] is not None else now
            tree.add_past_use(row["queue"], placement.chip, devices, row["start"], end, now)
        tree.advance(now)

    def pending_in(self, queue: str) -> int:
        """Jobs of `queue` waiting to start (counted by request shape, not one by one)."""
        by_shape = self.sched.pending.by_shape
        return sum(len(ws) for shape, ws in by_shape.items() if shape[0] == queue)

    def _workload(self, job_id: str, spec: JobSpec, submit_s: float) -> Workload:
        chips = tuple(spec.chips) or tuple(self.cluster.devices_by_chip())
        low, high = spec.device_range
        w = Workload(job_id, "train", spec.queue, spec.priority, chips, low, high, submit_s)
        w.per_node = spec.nproc_per_node if spec.exact_nodes else 0
        w.min_node = spec.nproc_per_node  # packed: never more nodes than it asked for
        return w

    def adopt(self, job_id: str, spec: JobSpec, submit_s: float, placement: Placement) -> bool:
        """Re-admit a job that kept running through a server restart on its devices."""
        if any(name not in self.index for name in placement.nodes) or self.submit(
            job_id, spec, submit_s
        ):
            return False
        w = self.workloads[job_id]
        self.sched.pending.remove(w)
        idx = np.array([self.index[name] for name in placement.nodes])
        counts = np.array(list(placement.nodes.values()), dtype=np.int32)
        alloc = Allocation(int(self.sched.cap.group[idx[0]]), idx, counts)
        borrowed = self.sched.tree.borrowed_if(w.queue, placement.chip, alloc.devices)
        self.sched.start(w, placement.chip, alloc, self.sched.clock.now_s(), borrowed)
        self.sched.out.clear()
        return True

    # ---- services ---------------------------------------------------------------------
    def submit_service(self, service_id: str, spec: ServiceSpec, submit_s: float) -> str:
        """Hand a service to the scheduler, which places its replicas (one device each)
        in its next cycles; returns "" or the reason it can never run."""
        chips = tuple(spec.chips) or tuple(self.cluster.devices_by_chip())
        n = spec.replicas
        w = Workload(service_id, "infer", spec.queue, spec.priority, chips, n, n, submit_s)
        if spec.tidal is not None:
            tidal = spec.tidal
            w.min_devices = tidal.min_replicas
            w.profile = forecast_profile(tidal.profile(n), tidal.lead_s, tidal.step_s)
            w.profile_step_s = tidal.step_s
        decision = self.sched.submit(w)
        if decision is not None and decision.action == "reject":
            return decision.reason
        self.workloads[service_id] = w
        return ""

    def adopt_service(
        self, service_id: str, spec: ServiceSpec, submit_s: float, nodes: list[str | None]
    ) -> str:
        """After a restart: the service again, replica slot i on `nodes[i]` (None: no
        device held there). Slot i is replica i's, so a slot whose node cannot be taken
        (full) gets a device elsewhere, or, with none free, the slots from it on are
        left to the scheduler's next cycles (never shifted onto the next replica's node).
        A slot on a node out of service (cordoned, lost) stays there, as before the
        restart: a replica still running there keeps it, one to start moves
        (`move_replica`)."""
        reason = self.submit_service(service_id, spec, submit_s)
        if reason:
            return reason
        w, cap = self.workloads[service_id], self.sched.cap
        keep = spec.replicas
        if w.profile is not None:  # a tidal service: the replicas it wants awake now
            now = self.sched.clock.now_s()
            keep = min(keep, max(w.min_devices, elastic.target_replicas(self.sched, w, now)))
        slots: list[Allocation | None] = []
        for name in nodes[:keep]:
            node = self.index.get(name) if name else None
            if node is None or (cap.avail[node] < 1 and name not in self.out_of_service):
                slots.append(None)
                continue
            alloc = Allocation(int(cap.group[node]), np.array([node]), np.array([1], np.int32))
            cap.take(alloc)
            slots.append(alloc)
        while slots and slots[-1] is None:
            slots.pop()
        for i, alloc in enumerate(slots):
            if alloc is None and (alloc := self._one_device(w)) is not None:
                cap.take(alloc)
                slots[i] = alloc
            if alloc is None:  # no device: the slots after it are not kept either
                for later in slots[i + 1 :]:
                    if later is not None:
                        cap.give(later)
                del slots[i:]
                break
        for alloc in slots:
            assert alloc is not None
            self.sched.tree.add(w.queue, cap.chips[alloc.group], 1)
            w.replicas.append(alloc)
        w.recount()
        return ""

    def move_replica(self, service_id: str, index: int) -> str | None:
        """Give replica slot `index` of the service a device on a node in service instead
        of its own (out of service: cordoned or lost); returns its new node, or None
        (no device free: it keeps its slot)."""
        w = self.workloads.get(service_id)
        if w is None or index >= w.replica_count:
            return None
        moved = self._one_device(w)
        if moved is None:
            return None
        cap, tree = self.sched.cap, self.sched.tree
        singles = [  # one chunk per device: slot i is chunk i
            Allocation(c.group, np.array([node]), np.array([1], np.int32))
            for c in w.replicas
            for node, k in zip(c.nodes.tolist(), c.counts.tolist(), strict=True)
            for _ in range(int(k))
        ]
        old = singles[index]
        cap.give(old)  # nothing there while the node is out of service
        tree.add(w.queue, cap.chips[old.group], -1)
        cap.take(moved)
        tree.add(w.queue, cap.chips[moved.group], 1)
        singles[index] = moved
        w.replicas = singles
        w.recount()
        return self.nodes[int(moved.nodes[0])].name

    def _one_device(self, w: Workload) -> Allocation | None:
        cap = self.sched.cap
        for chip in w.chips:
            for g in cap.groups_of_chip.get(chip, []):
                alloc = cap.place(g, 1)
                if alloc is not None:
                    return alloc
        return None

    def replica_nodes(self, service_id: str) -> list[str]:
        """The node of each placed replica, in placement order."""
        w = self.workloads.get(service_id)
        if w is None:
            return []
        out = []
        for chunk in w.replicas:
            for node, count in zip(chunk.nodes, chunk.counts, strict=True):
                out += [self.nodes[int(node)].name] * int(count)
        return out

    def free_on(self, name: str) -> int:
        """Devices of node `name` the scheduler counts free (0 out of service)."""
        node = self.index.get(name)
        return 0 if node is None else int(self.sched.cap.avail[node])

    def remove_service(self, service_id: str) -> None:
        """The service is gone: its replicas' devices go back to the pool."""
        w = self.workloads.pop(service_id, None)
        if w is None or w not in self.sched.services:
            return
        for chunk in w.replicas:
            self.sched.cap.give(chunk)
            self.sched.tree.add(w.queue, self.sched.cap.chips[chunk.group], -chunk.devices)
        w.replicas.clear()
        w.recount()
        self.sched.services.remove(w)
        self.sched.forecast_changed()

    # ---- the cycle and what ends -----------------------------------------------------
    def cycle(self) -> list[Decision]:
        return self.sched.cycle()

    def is_running(self, job_id: str) -> bool:
        """Whether the scheduler holds devices for the job now."""
        w = self.workloads.get(job_id)
        return w is not None and w.state == State.RUNNING and w.alloc is not None

    def placement(self, job_id: str) -> Placement:
        w = self.workloads[job_id]
        assert w.alloc is not None and w.chip is not None, "placed workloads have devices"
        names = [self.nodes[int(i)].name for i in w.alloc.nodes]
        return Placement(chip=w.chip, nodes=dict(zip(names, map(int, w.alloc.counts), strict=True)))

    def finished(self, job_id: str) -> None:
        """The job is over (or cancelled): free its devices or drop it from the queue."""
        w = self.workloads.pop(job_id, None)
        if w is None:
            return
        if w in self.sched.pending:
            self.sched.pending.remove(w)
        else:
            self.sched.complete(w)

    def requeue(self, job_id: str) -> None:
        """The attempt was lost: free its devices and queue it again."""
        w = self.workloads.get(job_id)
        if w is None or w in self.sched.pending:
            return
        self.sched.release(w)
        self.sched.enqueue(w)

    # ---- nodes -----------------------------------------------------------------------
    def set_in_service(self, name: str, in_service: bool) -> None:
        """Take a node out of placement (cordoned, lost) or bring it back; jobs on it are
        not touched."""
        if name not in self.index or (name not in self.out_of_service) == in_service:
            return
        node, cap = self.index[name], self.sched.cap
        if in_service:
            self.out_of_service.discard(name)
            cap.mark_up(node)
            for alloc in self._allocations():  # what still runs there stays taken
                if node in alloc.nodes:
                    count = alloc.counts[alloc.nodes == node]
                    cap.take(Allocation(alloc.group, np.array([node]), count))
        else:
            self.out_of_service.add(name)
            cap.mark_down(node)

    def fits_now(self, job_id: str) -> bool | None:
        """Whether the pending job's gang has a place on the nodes in service now, its
        quota aside: one node group (one chip, one node size) of an accepted chip with
        the nodes it needs free. None for a job the scheduler does not hold."""
        w = self.workloads.get(job_id)
        if w is None:
            return None
        return any(
            group.chip.id in w.chips
            and group.devices_per_node >= w.min_node
            and self.sched.cap.fits(g, w.min_devices, w.per_node)
            for g, group in enumerate(self.cluster.groups)
        )

    def used_on(self, name: str) -> int:
        node = self.index[name]
        return sum(int(a.counts[a.nodes == node].sum()) for a in self._allocations())

    def jobs_on(self, name: str) -> list[str]:
        """Jobs and services with devices on the node."""
        node = self.index[name]
        out = [
            w.id
            for w in self.sched.running.values()
            if w.alloc is not None and node in w.alloc.nodes
        ]
        out += [w.id for w in self.sched.services if any(node in r.nodes for r in w.replicas)]
        return out

    def _allocations(self) -> list[Allocation]:
        out = [w.alloc for w in self.sched.running.values() if w.alloc is not None]
        for w in self.sched.services:
            out += w.replicas
        return out


def forecast_profile(levels: list[float], lead_s: float, step_s: float) -> np.ndarray:
    """Each level raised to the highest level within the next `lead_s` (cyclic): the
    need the scheduler plans for now is the forecast's from `lead_s` ahead."""
    base = np.asarray(levels, dtype=np.float64)
    ahead = int(np.ceil(lead_s / step_s - 1e-9))
    out = base.copy()
    for k in range(1, min(ahead, len(base)) + 1):
        out = np.maximum(out, np.roll(base, -k))
    return out


def _largest_gang_text(nodes: list[NodeInfo], chips: list[str]) -> str:
    """What the largest node group an exact gang could use holds, for a refusal."""
    if not nodes:
        return f"no node of {chips} has that many devices"
    return f"at most {len(nodes)} such node(s): {_group_text(nodes)}"


def _roomiest_text(nodes: list[NodeInfo], chips: list[str]) -> str:
    """What the roomiest node group a packed job could use holds, for a refusal."""
    if not nodes:
        return f"no node of {chips} has that many devices"
    devices = sum(n.devices for n in nodes)
    return f"the most such a group holds is {devices} device(s): {_group_text(nodes)}"


def _group_text(nodes: list[NodeInfo]) -> str:
    names = ", ".join(n.name for n in nodes[:8]) + (", ..." if len(nodes) > 8 else "")
    return f"the {nodes[0].chip} nodes of {nodes[0].devices} device(s) ({names})"


def _cluster_spec(nodes: list[NodeInfo]) -> ClusterSpec:
    groups: dict[tuple[str, int], int] = {}
    for n in nodes:
        groups[(n.chip, n.devices)] = groups.get((n.chip, n.devices), 0) + 1
    specs = tuple(
        NodeGroupSpec(chip=chip, count=d * k, devices_per_node=d, domain_size=d, name=f"{chip}x{d}")
        for (chip, d), k in groups.items()
    )
    return ClusterSpec(name="server", groups=specs)


def _default_queues(devices: dict[str, int]) -> QueuesFile:
    quota = {chip: QuotaSpec(nominal=n) for chip, n in devices.items()}
    return QueuesFile(queues=[QueueSpec(name="default", quota=quota)])
