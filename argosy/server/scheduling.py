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
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from argosy.core.clock import Clock
from argosy.core.errors import UnknownNameError
from argosy.executors.base import NodeInfo
from argosy.hardware.catalog import default_catalog
from argosy.hardware.cluster import ClusterSpec, NodeGroupSpec, resolve
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.core import Scheduler
from argosy.scheduler.decisions import Decision
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, QueueSpec, QuotaSpec, build_tree, load_queues
from argosy.scheduler.workload import Allocation, Workload
from argosy.server.schemas import Placement
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
        chosen = dataclasses.replace(policies.get(policy), hot_spares=False)
        self.sched = Scheduler(self.cluster, tree, chosen, config, clock)
        self.workloads: dict[str, Workload] = {}
        self.out_of_service: set[str] = set()

    # ---- requests --------------------------------------------------------------------
    def check(self, spec: JobSpec) -> str:
        """Why `spec` can never run here ("" if it may): unknown queue or chip, too big."""
        tree = self.sched.tree
        if spec.queue not in tree.leaves:
            return str(UnknownNameError("leaf queue", spec.queue, tree.leaves))
        have = self.cluster.devices_by_chip()
        chips = []
        for name in spec.chips or list(have):
            try:
                chips.append(default_catalog().canonical(name))
            except UnknownNameError as err:
                return str(err)
        usable = [c for c in chips if c in have]
        if not usable:
            return f"accepts chip types {chips}; the cluster has {list(have)}"
        biggest = max(self._largest_gang(c, spec.nproc_per_node) for c in usable)
        if biggest < spec.nnodes:
            return (
                f"needs {spec.nnodes} node(s) with {spec.nproc_per_node} devices each; "
                f"at most {biggest} such node(s) of {usable}"
            )
        return ""

    def _largest_gang(self, chip: str, per_node: int) -> int:
        return sum(1 for n in self.nodes if n.chip == chip and n.devices >= per_node)

    def submit(self, job_id: str, spec: JobSpec, submit_s: float) -> str:
        """Queue the job; returns "" or the scheduler's reason it can never run."""
        w = self._workload(job_id, spec, submit_s)
        decision = self.sched.submit(w)
        if decision is not None and decision.action == "reject":
            return decision.reason
        self.workloads[job_id] = w
        return ""

    def _workload(self, job_id: str, spec: JobSpec, submit_s: float) -> Workload:
        chips = tuple(spec.chips) or tuple(self.cluster.devices_by_chip())
        n = spec.devices
        return Workload(job_id, "train", spec.queue, spec.priority, chips, n, n, submit_s)

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

    # ---- the cycle and what ends -----------------------------------------------------
    def cycle(self) -> list[Decision]:
        return self.sched.cycle()

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
            for w in self.sched.running.values():  # what still runs there stays taken
                if w.alloc is not None and node in w.alloc.nodes:
                    count = w.alloc.counts[w.alloc.nodes == node]
                    cap.take(Allocation(w.alloc.group, np.array([node]), count))
        else:
            self.out_of_service.add(name)
            cap.mark_down(node)

    def used_on(self, name: str) -> int:
        node = self.index[name]
        used = 0
        for w in self.sched.running.values():
            if w.alloc is not None:
                used += int(w.alloc.counts[w.alloc.nodes == node].sum())
        return used

    def jobs_on(self, name: str) -> list[str]:
        node = self.index[name]
        return [
            w.id
            for w in self.sched.running.values()
            if w.alloc is not None and node in w.alloc.nodes
        ]


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
