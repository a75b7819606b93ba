"""An in-memory Ray cluster with the shape of the part of the `ray` module that
`RayExecutor` calls, for tests that need no Ray processes:

    fake = FakeRay()
    fake.add_node("gpu-1", {"chip:h100-sxm": 8})
    executor = RayExecutor(ray=fake, background=False, clock=fake.clock)

What it keeps of Ray's contract (test_ray_fake.py checks the same scenario on both):
nodes stay in `nodes()` after they die, with `Alive` false; a placement group whose
bundles name nodes (`ray.io/node-id`) is `PENDING` until each of those nodes is alive and
has the bundle's resources free, then `CREATED`; removing it kills the actors placed in
it. An actor runs once its group is placed; its calls run in the order they were made,
a call on a dead actor resolves to `RayActorError`, and `get` on a call not yet run
raises `GetTimeoutError`. Named actors are listed until they die. The exceptions are
Ray's own classes.

What a test controls: `add_node`, `kill_node` (its actors die at once; Ray declares the
node dead now or, with `declare=False`, at `declare_dead`), `rejoin` (the node's host
starts a new raylet: same label, new node id), `exit_rank` (a launcher exits with a
code), `placing` (False: Ray places nothing, as when it lags), `stop_code` (what a
launcher exits with on SIGTERM; None ignores it) and `clock`.

The launchers are `FakeRunner`s, not processes: `start` records the command, `poll`
answers the code a test set.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ray.exceptions as ray_exceptions

from argosy.executors.base import AttemptExit, LaunchRequest
from argosy.executors.ray import RayExecutor, RayOptions
from argosy.executors.ray_launch import NodeJob

GCS_ADDRESS = "127.0.0.1:6379"
"""Where the fake cluster's head says it is (`get_runtime_context().gcs_address`)."""

NODE_ID_LABEL = "ray.io/node-id"
ARGOSY_LABEL = "argosy.io/node"


@dataclass(frozen=True)
class PlacementGroupID:
    hex_id: str

    @classmethod
    def from_hex(cls, hex_id: str) -> PlacementGroupID:
        return cls(hex_id)

    def hex(self) -> str:
        return self.hex_id


@dataclass(frozen=True)
class PlacementGroup:
    id: PlacementGroupID


@dataclass(frozen=True)
class PlacementGroupSchedulingStrategy:
    placement_group: PlacementGroup
    placement_group_bundle_index: int = -1


@dataclass
class FakeNode:
    node_id: str
    name: str
    address: str
    resources: dict[str, float]
    labelled: bool
    alive: bool = True
    """What Ray's node table says."""
    died: bool = False
    """Whether the raylet died (Ray may not have declared it yet)."""

    def entry(self) -> dict[str, Any]:
        """This node as an entry of `ray.nodes()`."""
        labels = {NODE_ID_LABEL: self.node_id} | (
            {ARGOSY_LABEL: self.name} if self.labelled else {}
        )
        return {
            "NodeID": self.node_id,
            "Alive": self.alive,
            "NodeManagerAddress": self.address,
            "Resources": dict(self.resources) if self.alive else {},
            "Labels": labels,
        }


@dataclass
class _Group:
    gid: str
    name: str
    bundles: list[dict[str, float]]
    selectors: list[dict[str, str]]
    state: str = "PENDING"
    on: list[str] = field(default_factory=list)
    """Node id of each bundle, once placed."""

    def entry(self) -> dict[str, Any]:
        return {
            "placement_group_id": self.gid,
            "name": self.name,
            "state": self.state,
            "bundles": dict(enumerate(self.bundles)),
            "bundles_to_node_id": dict(enumerate(self.on)),
        }


class FakeRunner:
    """`NodeRunner` without processes: the launcher's exit code is what a test sets."""

    def __init__(self, cluster: FakeRay) -> None:
        self.cluster = cluster
        self.command: list[str] | None = None
        self.env: dict[str, str] = {}
        self.job: NodeJob | None = None
        self.code: int | None = None

    @property
    def running(self) -> bool:
        return self.command is not None and self.code is None

    def start(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: str | None,
        log: str,
        job: NodeJob | None = None,
    ) -> int:
        self.command, self.env, self.job = list(command), dict(env), job
        return 4242

    def poll(self) -> int | None:
        assert self.command is not None, "start first"
        return self.code

    def stop(self) -> None:
        if self.running and self.cluster.stop_code is not None:
            self.code = self.cluster.stop_code

    def kill_job(self) -> int:
        if not self.running:
            return 0
        self.code = 137
        return 1


@dataclass
class ObjectRef:
    done: bool = False
    value: Any = None
    error: Exception | None = None

    def resolve(self, value: Any = None, error: Exception | None = None) -> None:
        self.done, self.value, self.error = True, value, error

    __hash__ = object.__hash__
    __eq__ = object.__eq__


@dataclass
class _Actor:
    aid: str
    name: str | None
    namespace: str
    group: str | None
    bundle: int
    num_gpus: float
    runner: FakeRunner
    state: str = "PENDING"
    node_id: str = ""
    queue: list[tuple[str, tuple[Any, ...], ObjectRef]] = field(default_factory=list)


class ActorHandle:
    def __init__(self, cluster: FakeRay, aid: str) -> None:
        self._cluster, self._aid = cluster, aid

    def __getattr__(self, method: str) -> SimpleNamespace:
        if method.startswith("_"):
            raise AttributeError(method)
        return SimpleNamespace(remote=lambda *args: self._cluster._call(self._aid, method, args))


class _ActorClass:
    def __init__(self, cluster: FakeRay) -> None:
        self._cluster = cluster

    def options(self, **options: Any) -> SimpleNamespace:
        return SimpleNamespace(remote=lambda: self._cluster._create_actor(options))

    def remote(self) -> ActorHandle:
        return self._cluster._create_actor({})


class FakeRay:
    """One fake Ray cluster, used in place of the `ray` module."""

    exceptions = ray_exceptions
    PlacementGroupID = PlacementGroupID

    def __init__(self) -> None:
        self.now = 1000.0
        self.placing = True
        self.stop_code: int | None = 143  # a launcher without a SIGTERM handler
        self._nodes: dict[str, FakeNode] = {}
        self._groups: dict[str, _Group] = {}
        self._actors: dict[str, _Actor] = {}
        self._ids = itertools.count(1)
        self.calls: list[tuple[str, str]] = []
        """(actor name, method) of every call made, in order."""
        self.util = SimpleNamespace(
            placement_group=self._placement_group,
            remove_placement_group=self._remove_placement_group,
            placement_group_table=self._placement_group_table,
            list_named_actors=self._list_named_actors,
            scheduling_strategies=SimpleNamespace(
                PlacementGroupSchedulingStrategy=PlacementGroupSchedulingStrategy
            ),
        )

    # ---- what a test controls -------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    def add_node(
        self,
        name: str,
        resources: dict[str, float],
        *,
        address: str = "",
        labelled: bool = True,
    ) -> str:
        """A raylet joins; returns its node id (`name` is its `argosy.io/node` label
        when `labelled`)."""
        node_id = f"{next(self._ids):08x}" + "f" * 48
        self._nodes[node_id] = FakeNode(
            node_id, name, address or f"10.0.0.{len(self._nodes) + 1}", resources, labelled
        )
        self._schedule()
        return node_id

    def node(self, name: str) -> FakeNode:
        """The newest raylet of the node called `name`."""
        return [n for n in self._nodes.values() if n.name == name][-1]

    def kill_node(self, name: str, *, declare: bool = True, unreachable: bool = False) -> None:
        """The node's raylet dies: its actors at once, Ray's verdict now or later. With
        `unreachable` (and not `declare`), what a caller first gets from its actors is
        `ActorUnavailableError`, as from real Ray in the seconds before its health check
        declares the node dead (the launchers died with the node); then they are dead."""
        node = self.node(name)
        node.died = True
        for actor in self._actors.values():
            if actor.node_id == node.node_id:
                if unreachable and not declare:
                    self._cut_off_actor(actor)
                else:
                    self._kill_actor(actor)
        for group in self._groups.values():
            if group.state == "CREATED" and node.node_id in group.on:
                group.state = "RESCHEDULING"
        if declare:
            node.alive = False

    def freeze_node(self, name: str) -> None:
        """The node hangs (a SIGSTOPped host, a partition, a raylet killed before Ray
        noticed): its actors answer no call, and Ray still lists it alive."""
        node = self.node(name)
        for actor in self._actors.values():
            if actor.node_id == node.node_id and actor.state == "ALIVE":
                actor.state = "FROZEN"

    def declare_dead(self, name: str) -> None:
        """Ray's health check declares the node's dead raylets dead (and their actors)."""
        for node in self._nodes.values():
            if node.name == name and node.died:
                node.alive = False
                for actor in self._actors.values():
                    if actor.node_id == node.node_id and actor.state == "UNREACHABLE":
                        self._kill_actor(actor)

    def rejoin(self, name: str) -> str:
        """The node's host starts a new raylet (same label and address, a new id), maybe
        before Ray declared the old one dead."""
        old = self.node(name)
        assert old.died, "a node rejoins after its raylet died"
        return self.add_node(name, old.resources, address=old.address, labelled=old.labelled)

    def exit_rank(self, tag: str, rank: int, code: int) -> bool:
        """Node rank `rank`'s launcher of attempt `tag` exits `code` (False: none runs)."""
        actor = self._named(f"{tag}-{rank}")
        if actor is None or not actor.runner.running:
            return False
        actor.runner.code = code
        return True

    def last_actor(self, name: str) -> tuple[str, FakeRunner] | None:
        """The state and launcher of the newest actor called `name`, dead or not."""
        found = [a for a in self._actors.values() if a.name == name]
        return (found[-1].state, found[-1].runner) if found else None

    def runner(self, name: str) -> FakeRunner | None:
        actor = self._named(name)
        return None if actor is None else actor.runner

    def actor_node(self, name: str) -> str:
        """The node id the live actor `name` runs on ("" while it waits for its group)."""
        actor = self._named(name)
        assert actor is not None, f"no live actor {name}"
        return actor.node_id

    def actor_gpus(self, name: str) -> float:
        actor = self._named(name)
        assert actor is not None, f"no live actor {name}"
        return actor.num_gpus

    def group_bundles(self, name: str) -> list[dict[str, float]]:
        """The bundles of the live placement group `name`."""
        return next(
            g.bundles for g in self._groups.values() if g.name == name and g.state != "REMOVED"
        )

    def live_groups(self) -> dict[str, str]:
        """Name -> state of every group not removed."""
        return {g.name: g.state for g in self._groups.values() if g.state != "REMOVED"}

    def live_actors(self) -> set[str]:
        return {a.name for a in self._actors.values() if a.name and a.state != "DEAD"}

    def set_placing(self, placing: bool) -> None:
        self.placing = placing
        self._schedule()

    # ---- the `ray` module ------------------------------------------------------------------
    def is_initialized(self) -> bool:
        return True

    def init(self, **_: Any) -> None:
        pass

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(gcs_address=GCS_ADDRESS)

    def nodes(self) -> list[dict[str, Any]]:
        return [n.entry() for n in self._nodes.values()]

    def remote(self, **_: Any) -> Callable[[type], _ActorClass]:
        return lambda _cls: _ActorClass(self)

    def wait(
        self, refs: list[ObjectRef], *, num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[ObjectRef], list[ObjectRef]]:
        ready = [r for r in refs if r.done][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: ObjectRef, *, timeout: float | None = None) -> Any:
        if not ref.done:
            raise ray_exceptions.GetTimeoutError("the call has not run")
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor: ActorHandle, *, no_restart: bool = True) -> None:
        self._kill_actor(self._actors[actor._aid])

    def get_actor(self, name: str, namespace: str | None = None) -> ActorHandle:
        actor = self._named(name)
        if actor is None:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return ActorHandle(self, actor.aid)

    # ---- `ray.util` ------------------------------------------------------------------------
    def _placement_group(
        self,
        bundles: list[dict[str, float]],
        strategy: str = "PACK",
        name: str = "",
        lifetime: str | None = None,
        bundle_label_selector: list[dict[str, str]] | None = None,
    ) -> PlacementGroup:
        gid = f"{next(self._ids):036x}"
        selectors = bundle_label_selector or [{} for _ in bundles]
        self._groups[gid] = _Group(gid, name, [dict(b) for b in bundles], selectors)
        self._schedule()
        return PlacementGroup(PlacementGroupID(gid))

    def _remove_placement_group(self, pg: PlacementGroup) -> None:
        group = self._groups[pg.id.hex()]
        group.state, group.on = "REMOVED", []
        for actor in self._actors.values():
            if actor.group == group.gid:
                self._kill_actor(actor)
        self._schedule()

    def _placement_group_table(self, pg: PlacementGroup | None = None) -> dict[str, Any]:
        if pg is not None:
            return self._groups[pg.id.hex()].entry()
        return {gid: g.entry() for gid, g in self._groups.items()}

    def _list_named_actors(self, all_namespaces: bool = False) -> list[Any]:
        named = [a for a in self._actors.values() if a.name and a.state != "DEAD"]
        if all_namespaces:
            return [{"name": a.name, "namespace": a.namespace} for a in named]
        return [a.name for a in named]

    # ---- the cluster's own doings ---------------------------------------------------------
    def _named(self, name: str) -> _Actor | None:
        return next(
            (a for a in self._actors.values() if a.name == name and a.state != "DEAD"), None
        )

    def _create_actor(self, options: dict[str, Any]) -> ActorHandle:
        name = options.get("name")
        if name and self._named(name) is not None:
            raise ValueError(f"The name {name} is already taken")
        strategy = options.get("scheduling_strategy")
        group = strategy.placement_group.id.hex() if strategy is not None else None
        bundle = strategy.placement_group_bundle_index if strategy is not None else -1
        aid = f"actor{next(self._ids)}"
        self._actors[aid] = _Actor(
            aid,
            name,
            options.get("namespace", "argosy"),
            group,
            bundle,
            float(options.get("num_gpus") or 0),
            FakeRunner(self),
        )
        if group is not None and self._groups[group].state == "REMOVED":
            self._kill_actor(self._actors[aid])  # Ray fails an actor of a removed group
        self._schedule()
        return ActorHandle(self, aid)

    def _call(self, aid: str, method: str, args: tuple[Any, ...]) -> ObjectRef:
        actor, ref = self._actors[aid], ObjectRef()
        self.calls.append((actor.name or aid, method))
        if actor.state == "DEAD":
            ref.resolve(error=_actor_died(actor))
        elif actor.state == "UNREACHABLE":
            ref.resolve(error=_actor_unavailable(actor))
        elif actor.state == "ALIVE":
            self._run(actor, method, args, ref)
        else:
            actor.queue.append((method, args, ref))
        return ref

    def _run(self, actor: _Actor, method: str, args: tuple[Any, ...], ref: ObjectRef) -> None:
        try:
            ref.resolve(getattr(actor.runner, method)(*args))
        except Exception as err:  # Ray wraps what a method raises
            ref.resolve(error=ray_exceptions.RayTaskError(method, str(err), type(err)))

    def _kill_actor(self, actor: _Actor) -> None:
        if actor.state == "DEAD":
            return
        actor.state = "DEAD"
        if actor.runner.running:  # the launcher dies with its actor (PDEATHSIG)
            actor.runner.code = 143
        for _, _, ref in actor.queue:
            ref.resolve(error=_actor_died(actor))
        actor.queue.clear()

    def _cut_off_actor(self, actor: _Actor) -> None:
        if actor.state == "DEAD":
            return
        actor.state = "UNREACHABLE"
        if actor.runner.running:
            actor.runner.code = 143
        for _, _, ref in actor.queue:
            ref.resolve(error=_actor_unavailable(actor))
        actor.queue.clear()

    def _free(self, node_id: str) -> dict[str, float]:
        node = self._nodes[node_id]
        free = dict(node.resources)
        for group in self._groups.values():
            if group.state in ("CREATED", "RESCHEDULING"):
                for on, bundle in zip(group.on, group.bundles, strict=True):
                    if on == node_id:
                        for key, amount in bundle.items():
                            free[key] = free.get(key, 0.0) - amount
        return free

    def _schedule(self) -> None:
        """Place every pending group that fits, then start the actors of placed groups."""
        if not self.placing:
            return
        for group in self._groups.values():
            if group.state == "PENDING":
                self._place(group)
        for actor in self._actors.values():
            if actor.state != "PENDING":
                continue
            if actor.group is None:
                alive = [n for n in self._nodes.values() if n.alive]
                where = alive[0].node_id if alive else ""
            else:
                group = self._groups[actor.group]
                where = group.on[actor.bundle] if group.state == "CREATED" else ""
            if where:
                actor.state, actor.node_id = "ALIVE", where
                queued, actor.queue = actor.queue, []
                for method, args, ref in queued:
                    self._run(actor, method, args, ref)

    def _place(self, group: _Group) -> None:
        chosen: list[str] = []
        taken: dict[str, dict[str, float]] = {}
        for bundle, selector in zip(group.bundles, group.selectors, strict=True):
            candidates = [
                n.node_id
                for n in self._nodes.values()
                if n.alive and all(n.entry()["Labels"].get(k) == v for k, v in selector.items())
            ]
            for node_id in candidates:
                free = taken.setdefault(node_id, self._free(node_id))
                if all(free.get(k, 0.0) >= v for k, v in bundle.items()):
                    for k, v in bundle.items():
                        free[k] -= v
                    chosen.append(node_id)
                    break
            else:
                return
        group.state, group.on = "CREATED", chosen


def _actor_died(actor: _Actor) -> Exception:
    return ray_exceptions.RayActorError(error_msg=f"the actor {actor.name or actor.aid} died")


def _actor_unavailable(actor: _Actor) -> Exception:
    why = f"the actor {actor.name or actor.aid} is unreachable"
    return ray_exceptions.ActorUnavailableError(why, None)


# ---- the executor over a fake, one tick at a time -----------------------------------------
CPU = {"chip:cpu": 2.0}


def fake_executor(fake: FakeRay, **options: Any) -> RayExecutor:
    return RayExecutor(
        RayOptions(stop_grace_s=5, **options), ray=fake, background=False, clock=fake.clock
    )


def request(job_id: str, nodes: dict[str, int], chip: str = "cpu", attempt: int = 1) -> Any:
    return LaunchRequest(
        job_id=job_id,
        attempt=attempt,
        script="train.py",
        args=(),
        nproc_per_node=1,
        run_dir=Path("/nonexistent") / job_id,
        nodes=nodes,
        chip=chip,
    )


def settle(fake: FakeRay, executor: RayExecutor, rounds: int = 3) -> list[AttemptExit]:
    """Let the executor's thread run `rounds` ticks, each a second apart."""
    exits = []
    for _ in range(rounds):
        fake.now += 1.0
        executor.step()
        exits += executor.poll()
    return exits


def names(executor: RayExecutor) -> list[str]:
    return sorted(n.name for n in executor.inventory())
