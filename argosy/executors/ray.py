"""The Ray executor: jobs run on an existing Ray cluster, a gang as a placement group.

Every alive node with chips is a node of the inventory. Its chips are a Ray custom
resource `chip:<catalog id>` (`ray start --resources '{"chip:h100-sxm": 8}'`), or else
Ray's own `GPU` resource with the `accelerator_type:<X>` Ray detected (`H100`, `A100-80G`),
X matched to a catalog chip (a node whose X matches none is left out, logged once). A
node's name is stable across a raylet restart, so one that dies and rejoins under a new
Ray node id is the same node: its Ray label `argosy.io/node` (`ray start --labels
argosy.io/node=gpu-7`), else its IP when no other unlabelled chip node has that IP, else
`<ip>-<first 8 hex of its node id>` (unstable: several unlabelled raylets on one host). The
executor places on the Ray node that holds the name now. An attempt placed on nodes A and
B becomes one detached placement group with a bundle `{"chip:<chip>": k}` (or `{"GPU": k}`,
its actor then holding those k GPUs, so the launcher sees exactly them) pinned to each
chosen node (the `ray.io/node-id` label), and on each bundle a detached `NodeRunner` actor
that runs `argosy launch --nnodes N --node-rank i` there, so fault tolerance and
checkpoints come along exactly as on the local executor. Every node rank checkpoints
into the job's one store, `<run dir>/checkpoints` (`--ckpt-dir`), so a step is written by
all of them and committed once; node rank 0 keeps its logs and events in the job's run
directory, node rank i in `<run dir>/node<i>`. The run directory must be on storage every
node mounts: before any rank starts, each node's launcher proves it sees the store (a
probe file per node under the attempt's name, `ARGOSY_GANG_ID`), and an attempt whose
nodes do not share it fails at once with exit 2 and a message saying so.

Detached actors and placement groups outlive the server: a restarted server finds its
attempts again by name (`argosy-<job>-<attempt>-<i>`). A node that dies takes its actor
with it; the attempt is then reported lost, the rest of the gang is stopped, the
placement group removed, and the server queues the job again. The node stays out of
the inventory for `suspect_s` (Ray's own health check takes seconds to declare it
dead), and an attempt pinned to a node Ray has declared dead is reported lost too.

The server never waits on Ray: one background thread makes every Ray call (node table,
placement groups, actors) with bounded waits, and the executor's methods read what it
last saw or hand it a command (tests build it with `background=False` and run the
thread's work one `step()` at a time, over a stand-in for the `ray` module). A stopped
attempt whose placement group Ray never placed ends at once; every ended attempt's actors
and placement group are removed before its exit is reported; a restarted server removes
the groups and actors nobody adopted. What a node offers and its name:
`ray_nodes.py`; what runs for a node rank (`node_command`, the `NodeRunner` actor):
`ray_launch.py`; how an attempt ended, from its node ranks' answers: `ray_gang.py`.

    executor = RayExecutor(RayOptions(address="127.0.0.1:6379"))
    executor = RayExecutor(ray=fake_ray, background=False, clock=fake_clock)  # tests
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.executors.base import AttemptExit, LaunchRequest, NodeInfo
from argosy.executors.isolation import JobIdentity, JobUser, JobUsers
from argosy.executors.limits import JobLimitsConfig
from argosy.executors.local import JOB_ENV, attempt_dir, kill_job_processes
from argosy.executors.ray_address import asks_for_token, refuse_open_cluster
from argosy.executors.ray_gang import GangAttempt, GangVerdicts, attempt_tag
from argosy.executors.ray_launch import NodeJob, NodeRunner, node_command
from argosy.executors.ray_nodes import (
    CHIP_PREFIX,
    GPU,
    ChipOffer,
    catalog_chip,
    chip_offer,
    node_names,
)
from argosy.runtime.shared_store import ENV_GANG

SUSPECT_S = 15.0
"""A node whose actor died is left out of the inventory this long (or until Ray declares
it dead), so a requeued gang is not placed on it again at once."""
NAMESPACE = "argosy"
TICK_S = 0.2
"""The longest the Ray thread waits on Ray before it takes the next commands."""
POLL_EVERY_S = 0.5
"""How often each running node rank is asked for its launcher's exit code."""
NODES_EVERY_S = 1.0
"""How often the Ray thread refreshes its copy of Ray's node table."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayOptions:
    """Where the Ray cluster is."""

    address: str = "auto"
    """Ray address (`host:port` of the head's GCS, or "auto")."""
    stop_grace_s: float = 30.0
    """Seconds a stopped attempt's launchers get to exit (they checkpoint first) before
    the attempt is killed and reported."""
    suspect_s: float = SUSPECT_S
    """Seconds a node whose actor died stays out of the inventory (server: `ray_suspect_s`)."""
    call_timeout_s: float = 10.0
    """The longest the Ray thread waits for the actors of an attempt to kill its ranks."""
    place_timeout_s: float = 300.0
    """How long Ray may take to place a new attempt's placement group before the attempt
    ends as lost and is queued again (`GangVerdicts._unplaced`)."""
    identity: JobIdentity | None = None
    """Which user jobs run as, as this machine sees it (what admission checks paths
    against); None: the server's own user."""
    job_users: JobUsers | None = None
    """The server's job-user settings, which each node's actor applies by its own rights
    (`ray_launch.NodeJob`); None: jobs run as Ray's user."""
    env_allow: tuple[str, ...] = ()
    """Environment names jobs inherit beyond the built-in allow-list (`job_env_allow`)."""
    limits: JobLimitsConfig | None = None
    """The server's job limits, applied by each node to its job users' launchers."""


class RayExecutor(GangVerdicts):
    """Runs attempts on a Ray cluster; every Ray call happens on one background thread.

    The methods of the `Executor` protocol never wait on Ray: `inventory` reads the node
    table the thread last fetched, `poll` takes the exits it found, and `start`, `stop`
    and `adopt` hand it a command (`adopt` always answers "still running"; an attempt
    that is gone is reported by `poll` moments later). `reap`, once adoption is over,
    removes the placement groups and actors of every attempt nobody adopted.

    `ray` is the Ray module (a stand-in with its shape in tests); with `background=False`
    no thread starts and `step()` does one round of the thread's work on the caller's
    thread; `clock` is the monotonic clock of every timeout."""

    name = "ray"
    lends_sleeping = False
    """A replica's placement group holds its GPUs while the actor lives, asleep or not."""

    def __init__(
        self,
        options: RayOptions | None = None,
        *,
        ray: Any = None,
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ray is None:
            import ray
        self.options = options or RayOptions()
        self.ray = ray
        self._clock = clock
        if not ray.is_initialized():
            with _own_signal_handlers():  # Ray's SIGTERM handler would exit 15 mid-shutdown
                ray.init(
                    address=self.options.address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    logging_level="WARNING",
                )
        if self.options.identity is not None and self.options.identity.active:
            # the cluster itself is asked: this client's own mode says nothing of it
            refuse_open_cluster(ray.get_runtime_context().gcs_address, asks_for_token)
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(NodeRunner)
        self._lock = threading.Lock()  # guards what both threads read: nodes and exits
        self._nodes: list[NodeInfo] = []
        self._ids: dict[str, str] = {}  # node name -> the Ray node id that holds it now
        self._addrs: dict[str, str] = {}
        self._keys: dict[str, str] = {}  # node name -> the Ray resource its chips are
        self._exits: list[AttemptExit] = []
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        # the thread's own state
        self._attempts: dict[str, GangAttempt] = {}
        self._alive: set[str] = set()
        self._suspect: dict[str, float] = {}  # node id -> monotonic time it may return
        self._seen: dict[str, int] = {}  # alive node id -> order in which it was first seen
        self._named: dict[str, str] = {}  # alive node id -> its name (kept while it lives)
        self._sightings = itertools.count(1)
        self._warned: set[str] = set()  # what was logged once already
        self._nodes_s = 0.0
        self._refresh_nodes()  # start-up: the server places its first jobs on these
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._serve, name="argosy-ray", daemon=True)
            self._thread.start()

    # ---- the Executor protocol: never waits on Ray ----------------------------------------
    def inventory(self) -> list[NodeInfo]:
        with self._lock:
            return list(self._nodes)

    def start(self, request: LaunchRequest) -> None:
        with self._lock:
            missing = [n for n in request.nodes if n not in self._ids]
            ids = [self._ids.get(n, "") for n in request.nodes]
            keys = [self._keys.get(n, CHIP_PREFIX + request.chip) for n in request.nodes]
            addr = self._addrs.get(next(iter(request.nodes), ""), "")
        if missing:
            raise ArgosyError(f"node(s) {', '.join(missing)} are not alive in the Ray cluster")
        identity = self.options.identity  # the job user's ids are this machine's, made here
        user = identity.for_queue(request.queue) if identity is not None else None
        self._send(partial(self._start, request, ids, keys, addr, user))

    def stop(self, job_id: str) -> None:
        self._send(partial(self._stop, job_id))

    def poll(self) -> list[AttemptExit]:
        with self._lock:
            out, self._exits = self._exits, []
        return out

    def adopt(self, job_id: str, attempt: int, run_dir: Path) -> AttemptExit | None:
        self._send(partial(self._adopt, job_id, attempt))
        return None

    def devices_busy(self, nodes: dict[str, int]) -> bool:
        return False  # Ray places each rank on GPUs it holds for it alone (and waits)

    def devices_of(self, job_id: str) -> str:
        return ""  # Ray narrows each actor's GPUs itself, on its node

    def lend(self, job_id: str) -> None:
        return None  # never asked: `lends_sleeping` is False

    def take_back(self, job_id: str) -> bool:
        return True

    def reap(self) -> None:
        """Adoption is over: remove every `argosy-*` placement group and actor that
        belongs to no adopted attempt (stale leftovers of an earlier server)."""
        self._send(self._reap)

    def close(self) -> None:
        """Finish the commands already sent, then end the thread (attempts run on)."""
        if self._thread is None:
            self._run_commands()
            return
        self._commands.put(None)
        self._wake.set()
        self._thread.join(timeout=2 * self.options.call_timeout_s)

    def step(self) -> None:
        """One round of the thread's work on the caller's thread, for an executor built
        with `background=False`: the commands sent so far, then one tick. Errors raise."""
        assert self._thread is None, "step() is for an executor without its thread"
        self._run_commands()
        self._tick()

    def _send(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake.set()

    # ---- the Ray thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            self._wake.clear()
            if not self._run_commands(guarded=True):
                return
            self._guarded(self._tick)

    def _run_commands(self, *, guarded: bool = False) -> bool:
        """Run the commands sent so far; False once the one that ends the thread came."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command is None:
                return False
            self._guarded(command) if guarded else command()

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:  # the thread outlives any one failure of Ray or of a command
            log.exception("ray executor: %s failed", getattr(step, "func", step))
            time.sleep(TICK_S)

    def _tick(self) -> None:
        """Refresh the node table when due, ask every unfinished rank for its exit code,
        wait at most `TICK_S` for answers, and settle the attempts that ended."""
        now = self._clock()
        if now - self._nodes_s >= NODES_EVERY_S:
            self._refresh_nodes()
        refs = {}
        for a in self._attempts.values():
            for i, actor in enumerate(a.actors):
                if i in a.codes:
                    continue
                if i not in a.asks and now - a.answered_s.get(i, 0.0) >= POLL_EVERY_S:
                    a.asks[i] = actor.poll.remote()
                refs |= {a.asks[i]: (a, i)} if i in a.asks else {}
        if refs:
            ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=TICK_S)
        else:
            ready = []
            if self._thread is not None:
                self._wake.wait(TICK_S)
        for ref in ready:
            a, i = refs[ref]
            self._answer(a, i, ref)
        for a in list(self._attempts.values()):
            ended = self._verdict(a)
            if ended is not None:
                self._end(a, ended)

    def _end(self, a: GangAttempt, ended: AttemptExit) -> None:
        """Free the attempt's Ray resources, then report how it ended (the server may
        place its next attempt on the same devices at once)."""
        self._attempts.pop(a.job_id, None)
        self._cleanup(a, kill_ranks=ended.exit_code != 0, lost=ended.lost_node_ranks)
        with self._lock:
            self._exits.append(ended)

    def _refresh_nodes(self) -> None:
        """Fetch Ray's node table and rebuild the inventory: each alive chip node under
        its stable name, mapped to the Ray node that holds the name now."""
        now = self._nodes_s = self._clock()
        table = self.ray.nodes()
        self._alive = {n["NodeID"] for n in table if n.get("Alive")}
        self._suspect = {k: t for k, t in self._suspect.items() if t > now and k in self._alive}
        self._seen = {x: self._seen.get(x) or next(self._sightings) for x in sorted(self._alive)}
        offers = [
            offer
            for node in table
            if node["NodeID"] in self._alive
            and (offer := chip_offer(node, self._match_accelerator)) is not None
        ]
        holders: dict[str, ChipOffer] = {}
        named = node_names(offers, self._named)
        self._named = {o.node_id: name for name, o in zip(named, offers, strict=True)}
        for name, offer in zip(named, offers, strict=True):
            if offer.node_id in self._suspect:
                continue
            held = holders.get(name)
            if held is not None:
                self._warn(
                    f"name {name}",
                    f"ray executor: Ray nodes {held.node_id[:8]} and "
                    f"{offer.node_id[:8]} both claim node {name}; the newer wins",
                )
            if held is None or self._seen[offer.node_id] > self._seen[held.node_id]:
                holders[name] = offer
        nodes = [NodeInfo(n, o.chip, o.devices, o.address) for n, o in sorted(holders.items())]
        with self._lock:
            self._nodes = nodes
            self._ids = {n: o.node_id for n, o in holders.items()}
            self._addrs = {n: o.address for n, o in holders.items()}
            self._keys = {n: o.resource for n, o in holders.items()}

    def _match_accelerator(self, reported: str) -> str | None:
        """The catalog id of a Ray `accelerator_type` (logged once when none matches)."""
        chip = catalog_chip(reported)
        if chip is None:
            self._warn(
                f"accelerator {reported}",
                f"ray executor: no catalog chip matches Ray's "
                f"accelerator_type {reported!r}; its nodes are left out",
            )
        return chip

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def _start(
        self,
        request: LaunchRequest,
        ids: list[str],
        keys: list[str],
        addr: str,
        user: JobUser | None = None,
    ) -> None:
        older = self._attempts.pop(request.job_id, None)
        if older is not None:  # an older attempt never has company
            self._cleanup(older, kill_ranks=True)
        names = list(request.nodes)
        bundles = [{key: float(request.nodes[n])} for n, key in zip(names, keys, strict=True)]
        tag = attempt_tag(request.job_id, request.attempt)
        pg = self.ray.util.placement_group(
            bundles,
            strategy="SPREAD",
            name=tag,
            lifetime="detached",
            bundle_label_selector=[{"ray.io/node-id": x} for x in ids],
        )
        strategy = self.ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
        port = random.randint(20000, 40000)
        actors, opts = [], self.options
        uid = (user.uid, user.gid) if user is not None else None
        for i, (name, key) in enumerate(zip(names, keys, strict=True)):
            gpus = request.nodes[name] if key == GPU else 0  # CUDA_VISIBLE_DEVICES: its own
            actor = self._actor_cls.options(
                name=f"{tag}-{i}",
                namespace=NAMESPACE,
                lifetime="detached",
                num_gpus=gpus,
                scheduling_strategy=strategy(pg, i),
            ).remote()
            run_dir = request.run_dir if i == 0 else request.run_dir / f"node{i}"
            command = node_command(request, len(names), i, addr, port, run_dir)
            env = request.env | {JOB_ENV: request.job_id, ENV_GANG: tag}
            log_file = attempt_dir(request.run_dir, request.attempt) / f"node{i}.log"
            job = NodeJob(
                str(request.run_dir), request.queue, opts.job_users, opts.env_allow, uid,
                opts.limits,
            )  # fmt: skip
            actor.start.remote(command, env, request.workdir, str(log_file), job)
            actors.append(actor)
        self._attempts[request.job_id] = GangAttempt(
            request.job_id, request.attempt, pg, actors, ids, names,
            placed_by_s=self._clock() + opts.place_timeout_s,
        )  # fmt: skip

    def _stop(self, job_id: str) -> None:
        a = self._attempts.get(job_id)
        if a is None or a.stop_s is not None:
            return
        a.stop_s = self._clock()
        for actor in a.actors:  # queued behind `start` on each actor: never lost
            actor.stop.remote()
        if not self._placed(a):  # nothing runs yet: it ends now, and its resources go
            self._end(a, AttemptExit(job_id, a.attempt, None, True, "stopped before Ray placed it"))

    def _placed(self, a: GangAttempt) -> bool:
        if len(a.answered_s) == len(a.actors) or a.pg is None:
            return True
        return self.ray.util.placement_group_table(a.pg).get("state") == "CREATED"

    def _adopt(self, job_id: str, attempt: int) -> None:
        """Track an earlier server's attempt again, or end it as lost when its placement
        group or the actor of any node rank is gone (a node died while no server watched:
        the rest of the gang is no gang)."""
        tag = attempt_tag(job_id, attempt)
        names = self._our_actors().get(tag, [])
        pg = self._our_groups().get(tag)
        actors = [self.ray.get_actor(name, namespace=NAMESPACE) for name in names]
        ranks = [int(name.rsplit("-", 1)[1]) for name in names]
        table = self.ray.util.placement_group_table(pg) if names and pg is not None else {}
        if table and ranks == list(range(len(table.get("bundles") or {}))):
            ids = _bundle_nodes(table, len(ranks))
            nodes = [self._named.get(x, "") for x in ids]
            self._attempts[job_id] = GangAttempt(job_id, attempt, pg, actors, ids, nodes)
            return
        why = "a node rank's Ray actor is gone" if names else "its Ray actors are gone"
        self._end(
            GangAttempt(job_id, attempt, pg, actors), AttemptExit(job_id, attempt, None, True, why)
        )

    def _reap(self) -> None:
        keep = {a.tag for a in self._attempts.values()}
        jobs = {a.job_id for a in self._attempts.values()}
        groups, actors = self._our_groups(), self._our_actors()
        for tag in sorted((set(groups) | set(actors)) - keep):
            job_id = tag.removeprefix("argosy-").rsplit("-", 1)[0]
            handles = [self.ray.get_actor(x, namespace=NAMESPACE) for x in actors.get(tag, [])]
            stale = GangAttempt(job_id, -1, groups.get(tag), handles)
            log.warning("ray executor: removing stale %s", tag)
            # an older attempt of a job that runs shares its job id: leave its processes be
            self._cleanup(stale, kill_ranks=job_id not in jobs)

    def _our_actors(self) -> dict[str, list[str]]:
        """Attempt tag -> the names of its live actors, by node rank."""
        out: dict[str, list[str]] = {}
        for entry in self.ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            if entry["namespace"] == NAMESPACE and name.startswith("argosy-"):
                out.setdefault(name.rsplit("-", 1)[0], []).append(name)
        return {tag: sorted(v, key=lambda x: int(x.rsplit("-", 1)[1])) for tag, v in out.items()}

    def _our_groups(self) -> dict[str, Any]:
        """Attempt tag -> its placement group, for groups not yet removed."""
        out = {}
        for entry in self.ray.util.placement_group_table().values():
            name = entry.get("name", "")
            if name.startswith("argosy-") and entry.get("state") != "REMOVED":
                out[name] = group_handle(self.ray, entry["placement_group_id"])
        return out

    def _cleanup(self, a: GangAttempt, *, kill_ranks: bool, lost: tuple[int, ...] = ()) -> None:
        """Kill the attempt's processes (with `kill_ranks`: every process of the job its
        actors can reach, waiting at most `call_timeout_s`), its actors and its placement
        group. Actors that never started are only killed. The node ranks `lost` (their
        node dead, hung or unreachable) are not asked: their call would only hold this
        thread until Ray gives up on it, seconds that delay the attempt's report; their
        actors are killed, and a launcher dies with its actor."""
        reach = [actor for i, actor in enumerate(a.actors) if i not in lost]
        if kill_ranks and reach and self._placed(a):
            refs = [actor.kill_job.remote() for actor in reach]
            self.ray.wait(refs, num_returns=len(refs), timeout=self.options.call_timeout_s)
        for actor in a.actors:
            with contextlib.suppress(Exception):  # already dead is fine
                self.ray.kill(actor, no_restart=True)
        if kill_ranks:
            kill_job_processes(a.job_id)  # ranks this machine may still hold
        if a.pg is not None:
            with contextlib.suppress(Exception):
                self.ray.util.remove_placement_group(a.pg)


def _bundle_nodes(table: dict[str, Any], size: int) -> list[str]:
    """The Ray node id of each bundle of a placed group (node rank order), from its entry
    of `placement_group_table`, or [] when Ray does not say for every bundle (an adopted
    gang's nodes can then be suspected and named in its reasons, as a started one's are)."""
    placed = table.get("bundles_to_node_id") or {}
    ids = [str(placed.get(i) or "") for i in range(size)]
    return ids if all(x.strip("0f") for x in ids) else []


def group_handle(ray: Any, hex_id: str) -> Any:
    """A handle on the placement group `hex_id`. `ray.util.placement_group` is the
    function, which hides the module of the same name; the `PlacementGroup` class lives
    in the function's module."""
    home = sys.modules[ray.util.placement_group.__module__]
    return home.PlacementGroup(ray.PlacementGroupID.from_hex(hex_id))


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """Keep this process's SIGTERM and SIGINT handlers across the block: `ray.init`
    installs its own on the main thread, which `sys.exit(15)` from inside the server's
    event loop and so replace uvicorn's orderly shutdown (a stop under systemd then
    reads as a failure)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)
