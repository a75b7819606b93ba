"""The Ray executor: jobs run on an existing Ray cluster, a gang as a placement group.

Chip types are Ray custom resources named `chip:<catalog id>` (`ray start --resources
'{"chip:h100-sxm": 8}'`); every alive node that has one is a node of the inventory,
named `<ip>-<first 8 hex of its node id>`. An attempt placed on nodes A and B becomes one
detached placement group with a bundle `{"chip:<chip>": k}` pinned to each chosen node
(the `ray.io/node-id` label), and on each bundle a detached `NodeRunner` actor that runs
`argosy launch --nnodes N --node-rank i` there, so fault tolerance and checkpoints come
along exactly as on the local executor. Every node rank checkpoints into the job's one
store, `<run dir>/checkpoints` (`--ckpt-dir`), so a step is written by all of them and
committed once; node rank 0 keeps its logs and events in the job's run directory, node
rank i in `<run dir>/node<i>`. The run directory must be on storage every node mounts:
before any rank starts, each node's launcher proves it sees the store (a probe file per
node under the attempt's name, `ARGOSY_GANG_ID`), and an attempt whose nodes do not share
it fails at once with exit 2 and a message saying so.

Detached actors and placement groups outlive the server: a restarted server finds its
attempts again by name (`argosy-<job>-<attempt>-<i>`). A node that dies takes its actor
with it; the attempt is then reported lost, the rest of the gang is stopped, the
placement group removed, and the server queues the job again. The node stays out of
the inventory for `SUSPECT_S` (Ray's own health check takes seconds to declare it
dead), and an attempt pinned to a node Ray has declared dead is reported lost too.

The server never waits on Ray: one background thread makes every Ray call (node table,
placement groups, actors) with bounded waits, and the executor's methods read what it
last saw or hand it a command. A stopped attempt whose placement group Ray never placed
ends at once; every ended attempt's actors and placement group are removed before its
exit is reported; a restarted server removes the groups and actors nobody adopted.

    executor = RayExecutor(RayOptions(address="127.0.0.1:6379"))
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.executors.base import AttemptExit, LaunchRequest, NodeInfo, describe_exit, is_lost
from argosy.executors.isolation import job_environment
from argosy.executors.local import JOB_ENV, attempt_dir, kill_job_processes
from argosy.runtime.shared_store import ENV_GANG

CHIP_PREFIX = "chip:"
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
PR_SET_PDEATHSIG = 1
DIED = -1
FAILED_TO_START = -2
"""Codes of a rank whose actor died, or whose `start` raised (never a real exit code)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayOptions:
    """Where the Ray cluster is."""

    address: str = "auto"
    """Ray address (`host:port` of the head's GCS, or "auto")."""
    stop_grace_s: float = 30.0
    """Seconds a stopped attempt's launchers get to exit (they checkpoint first) before
    the attempt is killed and reported."""
    call_timeout_s: float = 10.0
    """The longest the Ray thread waits for the actors of an attempt to kill its ranks."""


class NodeRunner:
    """Runs one node's `argosy launch` of an attempt; lives in a Ray actor."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.job_id = ""

    def start(self, command: list[str], env: dict[str, str], cwd: str | None, log: str) -> int:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        self.job_id = env.get(JOB_ENV, "")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                command,
                env=job_environment(os.environ, env),  # the worker's allowed part, then ours
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None, "start first"
        code = self.proc.poll()
        if code is not None and code < 0:
            return 128 - code  # killed by a signal: the shell's convention
        return code

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill_job(self) -> int:
        return kill_job_processes(self.job_id) if self.job_id else 0


@dataclass
class _RayAttempt:
    job_id: str
    attempt: int
    pg: Any
    actors: list[Any]
    node_ids: list[str] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    asks: dict[int, Any] = field(default_factory=dict)
    """Node rank -> its outstanding `poll` call."""
    answered_s: dict[int, float] = field(default_factory=dict)
    """Node rank -> when its actor last answered (a rank in here has started)."""
    stop_s: float | None = None
    """When a stop was asked (monotonic), or None."""

    @property
    def tag(self) -> str:
        return attempt_tag(self.job_id, self.attempt)


class RayExecutor:
    """Runs attempts on a Ray cluster; every Ray call happens on one background thread.

    The methods of the `Executor` protocol never wait on Ray: `inventory` reads the node
    table the thread last fetched, `poll` takes the exits it found, and `start`, `stop`
    and `adopt` hand it a command (`adopt` always answers "still running"; an attempt
    that is gone is reported by `poll` moments later). `reap`, once adoption is over,
    removes the placement groups and actors of every attempt nobody adopted."""

    name = "ray"

    def __init__(self, options: RayOptions | None = None) -> None:
        import ray

        self.options = options or RayOptions()
        self.ray = ray
        if not ray.is_initialized():
            ray.init(
                address=self.options.address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level="WARNING",
            )
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(NodeRunner)
        self._lock = threading.Lock()  # guards what both threads read: nodes and exits
        self._nodes: list[NodeInfo] = []
        self._ids: dict[str, str] = {}
        self._addrs: dict[str, str] = {}
        self._exits: list[AttemptExit] = []
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        # the thread's own state
        self._attempts: dict[str, _RayAttempt] = {}
        self._alive: set[str] = set()
        self._suspect: dict[str, float] = {}  # node id -> monotonic time it may return
        self._nodes_s = 0.0
        self._refresh_nodes()  # start-up: the server places its first jobs on these
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
            addr = self._addrs.get(next(iter(request.nodes), ""), "")
        if missing:
            raise ArgosyError(f"node(s) {', '.join(missing)} are not alive in the Ray cluster")
        self._send(partial(self._start, request, ids, addr))

    def stop(self, job_id: str) -> None:
        self._send(partial(self._stop, job_id))

    def poll(self) -> list[AttemptExit]:
        with self._lock:
            out, self._exits = self._exits, []
        return out

    def adopt(self, job_id: str, attempt: int, run_dir: Path) -> AttemptExit | None:
        self._send(partial(self._adopt, job_id, attempt))
        return None

    def reap(self) -> None:
        """Adoption is over: remove every `argosy-*` placement group and actor that
        belongs to no adopted attempt (stale leftovers of an earlier server)."""
        self._send(self._reap)

    def close(self) -> None:
        """Finish the commands already sent, then end the thread (attempts run on)."""
        self._commands.put(None)
        self._wake.set()
        self._thread.join(timeout=2 * self.options.call_timeout_s)

    def _send(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake.set()

    # ---- the Ray thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            self._wake.clear()
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if command is None:
                    return
                self._guarded(command)
            self._guarded(self._tick)

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:  # the thread outlives any one failure of Ray or of a command
            log.exception("ray executor: %s failed", getattr(step, "func", step))
            time.sleep(TICK_S)

    def _tick(self) -> None:
        """Refresh the node table when due, ask every unfinished rank for its exit code,
        wait at most `TICK_S` for answers, and settle the attempts that ended."""
        now = time.monotonic()
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
            self._wake.wait(TICK_S)
        for ref in ready:
            a, i = refs[ref]
            self._answer(a, i, ref)
        for a in list(self._attempts.values()):
            ended = self._verdict(a)
            if ended is not None:
                self._end(a, ended)

    def _answer(self, a: _RayAttempt, i: int, ref: Any) -> None:
        from ray.exceptions import ActorUnavailableError, RayActorError, RayError

        del a.asks[i]
        try:
            code = self.ray.get(ref, timeout=0)
        except ActorUnavailableError:
            return  # a passing disconnect: ask again
        except RayActorError:
            a.codes[i] = DIED
            return
        except RayError as err:
            log.warning("node rank %d of %s: %s", i, a.tag, err)
            a.codes[i] = FAILED_TO_START
            return
        a.answered_s[i] = time.monotonic()
        if code is not None:
            a.codes[i] = code

    def _verdict(self, a: _RayAttempt) -> AttemptExit | None:
        """How the attempt ended, or None while it runs: the first rank that failed or
        died ends the whole gang; all ranks exiting 0 is success."""
        job, n = a.job_id, a.attempt
        for i, code in sorted(a.codes.items()):
            if code == DIED:
                self._suspect_node(a, i)
                return AttemptExit(job, n, None, True, f"node rank {i}'s Ray node died")
            if code == FAILED_TO_START:
                return AttemptExit(job, n, None, False, f"node rank {i} could not start")
        gone = [x for x in a.node_ids if x not in self._alive]
        if gone:
            return AttemptExit(job, n, None, True, f"its Ray node {gone[0][:8]} is dead")
        if a.codes:
            worst = max(a.codes.values(), key=lambda c: (c != 0, c))
            if worst != 0 or len(a.codes) == len(a.actors):
                return AttemptExit(job, n, worst, is_lost(worst), describe_exit(worst))
        if a.stop_s is not None and time.monotonic() - a.stop_s > self.options.stop_grace_s:
            why = f"did not stop within {self.options.stop_grace_s:g} s; killed"
            return AttemptExit(job, n, None, True, why)
        return None

    def _suspect_node(self, a: _RayAttempt, i: int) -> None:
        if i < len(a.node_ids):
            self._suspect[a.node_ids[i]] = time.monotonic() + SUSPECT_S
            self._refresh_nodes()

    def _end(self, a: _RayAttempt, ended: AttemptExit) -> None:
        """Free the attempt's Ray resources, then report how it ended (the server may
        place its next attempt on the same devices at once)."""
        self._attempts.pop(a.job_id, None)
        self._cleanup(a, kill_ranks=ended.exit_code != 0)
        with self._lock:
            self._exits.append(ended)

    def _refresh_nodes(self) -> None:
        self._nodes_s = time.monotonic()
        table = self.ray.nodes()
        now = time.monotonic()
        self._alive = {n["NodeID"] for n in table if n.get("Alive")}
        self._suspect = {k: t for k, t in self._suspect.items() if t > now and k in self._alive}
        nodes, ids, addrs = [], {}, {}
        for node in table:
            if node["NodeID"] not in self._alive or node["NodeID"] in self._suspect:
                continue
            name = f"{node['NodeManagerAddress']}-{node['NodeID'][:8]}"
            for resource, amount in node.get("Resources", {}).items():
                if resource.startswith(CHIP_PREFIX) and amount >= 1:
                    ids[name] = node["NodeID"]
                    addrs[name] = node["NodeManagerAddress"]
                    chip = resource.removeprefix(CHIP_PREFIX)
                    nodes.append(NodeInfo(name, chip, int(amount), node["NodeManagerAddress"]))
        with self._lock:
            self._nodes, self._ids, self._addrs = nodes, ids, addrs

    def _start(self, request: LaunchRequest, ids: list[str], addr: str) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        older = self._attempts.pop(request.job_id, None)
        if older is not None:  # an older attempt never has company
            self._cleanup(older, kill_ranks=True)
        names = list(request.nodes)
        bundles = [{CHIP_PREFIX + request.chip: float(request.nodes[n])} for n in names]
        tag = attempt_tag(request.job_id, request.attempt)
        pg = placement_group(
            bundles,
            strategy="SPREAD",
            name=tag,
            lifetime="detached",
            bundle_label_selector=[{"ray.io/node-id": x} for x in ids],
        )
        port = random.randint(20000, 40000)
        actors = []
        for i, _ in enumerate(names):
            actor = self._actor_cls.options(
                name=f"{tag}-{i}",
                namespace=NAMESPACE,
                lifetime="detached",
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
            ).remote()
            run_dir = request.run_dir if i == 0 else request.run_dir / f"node{i}"
            command = node_command(request, len(names), i, addr, port, run_dir)
            env = request.env | {JOB_ENV: request.job_id, ENV_GANG: tag}
            log_file = attempt_dir(request.run_dir, request.attempt) / f"node{i}.log"
            actor.start.remote(command, env, request.workdir, str(log_file))
            actors.append(actor)
        self._attempts[request.job_id] = _RayAttempt(
            request.job_id, request.attempt, pg, actors, ids
        )

    def _stop(self, job_id: str) -> None:
        a = self._attempts.get(job_id)
        if a is None or a.stop_s is not None:
            return
        a.stop_s = time.monotonic()
        for actor in a.actors:  # queued behind `start` on each actor: never lost
            actor.stop.remote()
        if not self._placed(a):  # nothing runs yet: it ends now, and its resources go
            self._end(a, AttemptExit(job_id, a.attempt, None, True, "stopped before Ray placed it"))

    def _placed(self, a: _RayAttempt) -> bool:
        from ray.util import placement_group_table

        if len(a.answered_s) == len(a.actors) or a.pg is None:
            return True
        return placement_group_table(a.pg).get("state") == "CREATED"

    def _adopt(self, job_id: str, attempt: int) -> None:
        tag = attempt_tag(job_id, attempt)
        names = self._our_actors().get(tag, [])
        pg = self._our_groups().get(tag)
        if not names:
            gone = AttemptExit(job_id, attempt, None, True, "its Ray actors are gone")
            self._end(_RayAttempt(job_id, attempt, pg, []), gone)
            return
        actors = [self.ray.get_actor(name, namespace=NAMESPACE) for name in names]
        self._attempts[job_id] = _RayAttempt(job_id, attempt, pg, actors)

    def _reap(self) -> None:
        keep = {a.tag for a in self._attempts.values()}
        jobs = {a.job_id for a in self._attempts.values()}
        groups, actors = self._our_groups(), self._our_actors()
        for tag in sorted((set(groups) | set(actors)) - keep):
            job_id = tag.removeprefix("argosy-").rsplit("-", 1)[0]
            handles = [self.ray.get_actor(x, namespace=NAMESPACE) for x in actors.get(tag, [])]
            stale = _RayAttempt(job_id, -1, groups.get(tag), handles)
            log.warning("ray executor: removing stale %s", tag)
            # an older attempt of a job that runs shares its job id: leave its processes be
            self._cleanup(stale, kill_ranks=job_id not in jobs)

    def _our_actors(self) -> dict[str, list[str]]:
        """Attempt tag -> the names of its live actors, by node rank."""
        from ray.util import list_named_actors

        out: dict[str, list[str]] = {}
        for entry in list_named_actors(all_namespaces=True):
            name = entry["name"]
            if entry["namespace"] == NAMESPACE and name.startswith("argosy-"):
                out.setdefault(name.rsplit("-", 1)[0], []).append(name)
        return {tag: sorted(v, key=lambda x: int(x.rsplit("-", 1)[1])) for tag, v in out.items()}

    def _our_groups(self) -> dict[str, Any]:
        """Attempt tag -> its placement group, for groups not yet removed."""
        from ray import PlacementGroupID
        from ray.util import placement_group_table
        from ray.util.placement_group import PlacementGroup

        out = {}
        for entry in placement_group_table().values():
            name = entry.get("name", "")
            if name.startswith("argosy-") and entry.get("state") != "REMOVED":
                out[name] = PlacementGroup(PlacementGroupID.from_hex(entry["placement_group_id"]))
        return out

    def _cleanup(self, a: _RayAttempt, *, kill_ranks: bool) -> None:
        """Kill the attempt's processes (with `kill_ranks`: every process of the job its
        actors can reach, waiting at most `call_timeout_s`), its actors and its placement
        group. Actors that never started are only killed."""
        from ray.util import remove_placement_group

        if kill_ranks and a.actors and self._placed(a):
            refs = [actor.kill_job.remote() for actor in a.actors]
            self.ray.wait(refs, num_returns=len(refs), timeout=self.options.call_timeout_s)
        for actor in a.actors:
            with contextlib.suppress(Exception):  # already dead is fine
                self.ray.kill(actor, no_restart=True)
        if kill_ranks:
            kill_job_processes(a.job_id)  # ranks this machine may still hold
        if a.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(a.pg)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGTERM when the process that started
    it dies (Linux `prctl(PR_SET_PDEATHSIG)`): a launcher never outlives its actor (a
    dead raylet takes its workers along), and on SIGTERM it stops its ranks. The C
    function is looked up here, before the fork; the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the call took effect
            os._exit(128 + signal.SIGTERM)

    return arm


def attempt_tag(job_id: str, attempt: int) -> str:
    """The name of an attempt's placement group, and its actors' with `-<node rank>`."""
    return f"argosy-{job_id}-{attempt}"


def node_command(
    request: LaunchRequest, nnodes: int, rank: int, addr: str, port: int, run_dir: Path
) -> list[str]:
    """`argosy launch` for node rank `rank` of an attempt on `nnodes` nodes, or the
    request's own command."""
    if request.command:
        return list(request.command)
    command = [sys.executable, "-m", "argosy", "launch", "--quiet"]
    command += ["--nproc-per-node", str(request.nproc_per_node), "--run-dir", str(run_dir)]
    command += ["--ckpt-dir", str(request.run_dir / "checkpoints")]  # one store for all nodes
    if nnodes > 1:
        command += ["--nnodes", str(nnodes), "--node-rank", str(rank)]
        command += ["--master-addr", addr, "--master-port", str(port)]
    if request.max_restarts is not None:
        command += ["--max-restarts", str(request.max_restarts)]
    for entry in request.inject:
        command += ["--inject", entry]
    return [*command, request.script, *request.args]
