"""The control loop's nodes: cordons, health verdicts, nodes lost, back and joined.

`NodeControl` is the part of `argosy.server.control.Control` that keeps which nodes may
take work: an admin's cordon, the node-record policy's verdicts (`NodeHealth`: what
runs report about their nodes counts against them), and what the executor's inventory
says (a node it no longer lists is lost: out of placement, a fault on its record; one
that comes back is placeable again; one seen for the first time joins, and the
scheduler is rebuilt over the larger cluster with everything the old one held).

The inventory is kept in the store (`nodes`: chip, devices, address, since when lost),
so a node that is down across a server restart is still listed, lost, and counted once:
a restarted server does not forget it, nor blame it again. An admin forgets a node that
is gone for good (`forget_node`: lost, nothing on it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from argosy.core.clock import Clock
from argosy.core.confined import read_job_text, stat_job_file
from argosy.core.errors import ArgosyError
from argosy.executors.base import Executor, NodeInfo
from argosy.health.policy import EvidenceKind
from argosy.scheduler.workload import State as WorkloadState
from argosy.server.config import ServerConfig
from argosy.server.job_json import loads_job_json
from argosy.server.node_health import NodeHealth
from argosy.server.scheduling import Scheduling
from argosy.server.schemas import ACTIVE, NodeView
from argosy.server.services import Services
from argosy.server.spec import JobSpec
from argosy.server.store import SYSTEM_ACTOR, Store
from argosy.server.views import node_views

NODE_HEALTH_LIMIT_BYTES = 1 << 20
"""The most of a job's node_health.json the server reads (the job writes it)."""


class NotFoundError(ArgosyError):
    """No such job or node."""


class NodeBusyError(ArgosyError):
    """The node cannot be forgotten: it is not lost, or work still holds it."""


def known_inventory(store: Store, executor: Executor) -> list[NodeInfo]:
    """The executor's nodes now (remembered in the store), then every remembered node it
    no longer lists: a server that starts while a node is down still places around it.
    An executor with a `fixed_inventory` (this machine's slots) lists all there is: the
    nodes of an earlier configuration are forgotten."""
    listed = executor.inventory()
    store.remember_nodes((n.name, n.chip, n.devices, n.address) for n in listed)
    names = {n.name for n in listed}
    gone = [r for r in store.known_nodes() if r["name"] not in names]
    if getattr(executor, "fixed_inventory", False):  # this machine's slots: none is down
        for r in gone:
            store.forget_node(r["name"])
        return listed
    return [
        *listed,
        *(NodeInfo(r["name"], r["chip"], r["devices"], r["address"] or "") for r in gone),
    ]


class NodeControl:
    """Node bookkeeping over the control loop's scheduler, store and executor."""

    config: ServerConfig
    store: Store
    executor: Executor
    clock: Clock
    scheduling: Scheduling
    services: Services
    health: NodeHealth
    cordoned: set[str]
    lost: set[str]
    poke: Callable[[], None]
    _finish: Callable[..., None]
    run_dir: Callable[[str], Path]

    def set_cordon(self, name: str, cordoned: bool, *, actor: str = SYSTEM_ACTOR) -> None:
        if name not in self.scheduling.index:
            raise NotFoundError(f"unknown node '{name}'; known: {', '.join(self.scheduling.index)}")
        self.store.set_cordon(name, cordoned, actor=actor)
        (self.cordoned.add if cordoned else self.cordoned.discard)(name)
        self._sync_node(name)
        self.poke()

    def report_health(
        self, name: str, verdict: str, detail: str, *, actor: str = SYSTEM_ACTOR
    ) -> None:
        """Apply a health verdict about a node (the node-record policy); a node the policy
        takes out of service leaves placement, one it lets back returns."""
        if name not in self.scheduling.index:
            raise NotFoundError(f"unknown node '{name}'; known: {', '.join(self.scheduling.index)}")
        self.health.report(name, verdict, detail, actor=actor)
        self._sync_node(name)
        self.poke()

    def node_views(self) -> list[NodeView]:
        """Every node as the API, the CLI and the console show it."""
        lost_at = self.store.lost_since() if self.lost else {}
        return node_views(self.scheduling, self.cordoned, self.lost, self.health_states(), lost_at)

    def health_states(self) -> dict[str, str]:
        return {name: r.state.value for name, r in self.health.records.items()}

    def _sync_node(self, name: str) -> None:
        unhealthy = name in self.health.out_of_service()
        in_service = name not in self.cordoned and name not in self.lost and not unhealthy
        self.scheduling.set_in_service(name, in_service)

    def _check_nodes(self) -> None:
        """Nodes the executor no longer reports are lost (out of placement); nodes that
        come back are placeable again; nodes seen for the first time join (the scheduler
        is rebuilt over them). The attempts on a lost node are reported lost by the
        executor itself."""
        inventory = self.executor.inventory()
        joined = [n for n in inventory if n.name not in self.scheduling.index]
        if joined:
            self._add_nodes(joined)
        alive = {n.name for n in inventory}
        for name in self.scheduling.index:
            lost = name not in alive
            if lost != (name in self.lost):
                (self.lost.add if lost else self.lost.discard)(name)
                self.store.set_node_lost(name, time.time() if lost else None)
                self.store.add_event(None, "node_lost" if lost else "node_back", f"node {name}")
                if lost:  # the node's page and the policy see it: losses count as faults
                    self.health.report(
                        name, "fault", "node lost: the executor stopped reporting it"
                    )
                self._sync_node(name)
                self.poke()

    def forget_node(self, name: str, *, actor: str = SYSTEM_ACTOR) -> None:
        """Drop a lost node nothing holds from the inventory, for good (it joins again
        as new if it comes back)."""
        if name not in self.scheduling.index:
            raise NotFoundError(f"unknown node '{name}'; known: {', '.join(self.scheduling.index)}")
        if name not in self.lost:
            raise NodeBusyError(
                f"node '{name}' is not lost: only a lost node can be forgotten "
                "(`argosy cordon` keeps work off a live one)"
            )
        if len(self.scheduling.index) == 1:
            raise NodeBusyError(f"node '{name}' is the last node the server knows: it stays")
        held = self.scheduling.jobs_on(name)
        if held:
            raise NodeBusyError(
                f"node '{name}' still holds {', '.join(held)}: wait for their requeue"
            )
        self._rebuild([n for n in self.scheduling.nodes if n.name != name])  # may refuse
        self.store.forget_node(name, actor=actor)
        self.lost.discard(name)
        self.cordoned.discard(name)

    def _add_nodes(self, joined: list[NodeInfo]) -> None:
        self.store.remember_nodes((n.name, n.chip, n.devices, n.address) for n in joined)
        self._rebuild([*self.scheduling.nodes, *joined])
        for n in joined:
            self._sync_node(n.name)  # a name back after a forget keeps its cordon by health
            self.store.add_event(None, "node_joined", f"node {n.name} ({n.devices} {n.chip})")

    def _rebuild(self, nodes: list[NodeInfo]) -> None:
        """A new scheduler over `nodes`, handed what the old one held: running jobs at
        their placements, pending jobs in submit order, services with their replicas,
        nodes out of service (a node left out holds nothing). `NodeBusyError`, with
        nothing changed, when a running job could not be re-admitted (a smaller cluster
        whose pinned reservations leave it no room); a pending job that can no longer
        run anywhere fails as rejected."""
        old = self.scheduling
        new = Scheduling(
            nodes,
            self.config.queues_file,
            self.config.policy,
            self.config.scheduler,
            self.clock,
        )
        rejected, unkept = [], []
        for row in self.store.jobs_in(["pending", *ACTIVE]):
            w = old.workloads.get(row["id"])
            if w is None:
                continue
            spec = JobSpec.model_validate(row["spec"])
            if w.state == WorkloadState.RUNNING:
                if not new.adopt(row["id"], spec, w.submit_s, old.placement(row["id"])):
                    unkept.append(row["id"])
            elif reason := new.submit(row["id"], spec, w.submit_s):  # its nodes were forgotten
                rejected.append((row["id"], reason))
        if unkept:
            raise NodeBusyError(f"running jobs would have no room without it: {', '.join(unkept)}")
        for job_id, reason in rejected:
            self._finish(job_id, "failed", reason, ("rejected", reason))
        self.services.rebuild(new)
        new.sched.tree.inherit_use(old.sched.tree)
        for name in old.out_of_service & set(new.index):
            new.set_in_service(name, False)
        self.scheduling = new
        self.poke()

    def _absorb_node_health(
        self,
        job_id: str,
        nodes: list[str],
        started_s: float,
        ended_s: float,
        lost_ranks: tuple[int, ...] = (),
    ) -> None:
        """What the attempt's run says about its nodes counts against them: node rank i's
        launcher writes `node_health.json` in its own run directory (`node<i>` for i > 0)
        about the ranks it runs, all on the i-th node of the placement. The job writes it:
        taken within the bounds of `NodeHealth.absorb_run`, dated within the attempt, and
        only when written since the attempt started (a file an earlier attempt left, its
        evidence counted then, is not counted again). When the executor names node ranks
        it lost (`lost_ranks`), the other node ranks' crashes and hangs followed from that
        loss (a collective with a vanished peer fails or stalls): only their straggler and
        preflight evidence counts."""
        run_dir = self.run_dir(job_id)
        for rank, node in enumerate(nodes):
            where = run_dir / f"node{rank}" if rank else run_dir
            path = where / "node_health.json"
            if node not in self.scheduling.index:
                continue
            found = stat_job_file(path)
            if found is None or found.st_mtime < started_s:
                continue  # none, or an earlier attempt's (one whose launcher never ran)
            try:
                text = read_job_text(path, limit=NODE_HEALTH_LIMIT_BYTES) or ""
                entries = loads_job_json(text).get("evidence") or []
            except (OSError, ValueError, AttributeError):
                continue
            if lost_ranks and rank not in lost_ranks and isinstance(entries, list):
                entries = [x for x in entries if not _fault_entry(x)]  # the peer's loss
            self.health.absorb_run(node, entries, since_s=started_s, until_s=ended_s, job_id=job_id)
            self._sync_node(node)


def _fault_entry(entry: object) -> bool:
    """Whether a run's evidence entry is a crash or hang (FAULT evidence)."""
    return isinstance(entry, dict) and entry.get("kind") == EvidenceKind.FAULT.value
