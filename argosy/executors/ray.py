"""The Ray executor: jobs run on an existing Ray cluster, a gang as a placement group.

Chip types are Ray custom resources named `chip:<catalog id>` (`ray start --resources
'{"chip:h100-sxm": 8}'`); every alive node that has one is a node of the inventory,
named `<ip>-<first 8 hex of its node id>`. An attempt placed on nodes A and B becomes one
detached placement group with a bundle `{"chip:<chip>": k}` pinned to each chosen node
(the `ray.io/node-id` label), and on each bundle a detached `NodeRunner` actor that runs
`argosy launch --nnodes N --node-rank i` there, so fault tolerance and checkpoints come
along exactly as on the local executor. Node rank 0 writes into the job's run directory,
node rank i into `<run dir>/node<i>` (a run directory on shared storage lets an attempt
resume on other nodes).

Detached actors and placement groups outlive the server: a restarted server finds its
attempts again by name (`argosy-<job>-<attempt>-<i>`). A node that dies takes its actor
with it; the attempt is then reported lost, the rest of the gang is stopped, the
placement group removed, and the server queues the job again. The node stays out of
the inventory for `SUSPECT_S` (Ray's own health check takes seconds to declare it
dead), and an attempt pinned to a node Ray has declared dead is reported lost too.

    executor = RayExecutor(RayOptions(address="127.0.0.1:6379"))
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argosy.executors.base import AttemptExit, LaunchRequest, NodeInfo, describe_exit, is_lost
from argosy.executors.isolation import job_environment
from argosy.executors.local import JOB_ENV, attempt_dir, kill_job_processes

CHIP_PREFIX = "chip:"
SUSPECT_S = 15.0
"""A node whose actor died is left out of the inventory this long (or until Ray declares
it dead), so a requeued gang is not placed on it again at once."""
NAMESPACE = "argosy"


@dataclass(frozen=True)
class RayOptions:
    """Where the Ray cluster is."""

    address: str = "auto"
    """Ray address (`host:port` of the head's GCS, or "auto")."""


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


class RayExecutor:
    """Runs attempts on a Ray cluster."""

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
        self._ids: dict[str, str] = {}
        self._addrs: dict[str, str] = {}
        self._running: dict[str, _RayAttempt] = {}
        self._alive: set[str] = set()
        self._suspect: dict[str, float] = {}  # node id -> monotonic time it may return

    def inventory(self) -> list[NodeInfo]:
        out = []
        now = time.monotonic()
        self._alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        for node in self.ray.nodes():
            if not node.get("Alive") or self._suspect.get(node["NodeID"], 0.0) > now:
                continue
            name = f"{node['NodeManagerAddress']}-{node['NodeID'][:8]}"
            for resource, amount in node.get("Resources", {}).items():
                if resource.startswith(CHIP_PREFIX) and amount >= 1:
                    self._ids[name] = node["NodeID"]
                    self._addrs[name] = node["NodeManagerAddress"]
                    chip = resource.removeprefix(CHIP_PREFIX)
                    out.append(NodeInfo(name, chip, int(amount), node["NodeManagerAddress"]))
        return out

    def start(self, request: LaunchRequest) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not self._ids:
            self.inventory()
        older = self._running.pop(request.job_id, None)
        if older is not None:  # an older attempt never has company
            self._cleanup(older, AttemptExit(older.job_id, older.attempt, None, True, "replaced"))
        names = list(request.nodes)
        bundles = [{CHIP_PREFIX + request.chip: float(request.nodes[n])} for n in names]
        labels = [{"ray.io/node-id": self._ids[n]} for n in names]
        tag = f"argosy-{request.job_id}-{request.attempt}"
        pg = placement_group(
            bundles,
            strategy="SPREAD",
            name=tag,
            lifetime="detached",
            bundle_label_selector=labels,
        )
        port = random.randint(20000, 40000)
        addr = self._addrs[names[0]]
        actors = []
        for i, _ in enumerate(names):
            actor = self._actor_cls.options(
                name=f"{tag}-{i}",
                namespace=NAMESPACE,
                lifetime="detached",
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
            ).remote()
            run_dir = request.run_dir if i == 0 else request.run_dir / f"node{i}"
            command = node_command(request, len(names), i, str(addr), port, run_dir)
            env = request.env | {JOB_ENV: request.job_id}
            log = attempt_dir(request.run_dir, request.attempt) / f"node{i}.log"
            actor.start.remote(command, env, request.workdir, str(log))
            actors.append(actor)
        ids = [self._ids[n] for n in names]
        self._running[request.job_id] = _RayAttempt(
            request.job_id, request.attempt, pg, actors, ids
        )

    def stop(self, job_id: str) -> None:
        current = self._running.get(job_id)
        if current is None:
            return
        for actor in current.actors:
            actor.stop.remote()

    def poll(self) -> list[AttemptExit]:
        out = []
        for job_id, current in list(self._running.items()):
            ended = self._ended(current)
            if ended is not None:
                self._cleanup(current, ended)
                del self._running[job_id]
                out.append(ended)
        return out

    def adopt(self, job_id: str, attempt: int, run_dir: Path) -> AttemptExit | None:
        from ray.util import placement_group_table

        tag = f"argosy-{job_id}-{attempt}"
        actors = []
        for i in range(1024):
            try:
                actors.append(self.ray.get_actor(f"{tag}-{i}", namespace=NAMESPACE))
            except ValueError:
                break
        pgs = [p for p in placement_group_table().values() if p.get("name") == tag]
        if not actors:
            return AttemptExit(job_id, attempt, None, True, "its Ray actors are gone")
        pg = self.ray.util.get_placement_group(tag) if pgs else None
        current = _RayAttempt(job_id, attempt, pg, actors)
        self._running[job_id] = current
        return None

    def _ended(self, a: _RayAttempt) -> AttemptExit | None:
        from ray.exceptions import GetTimeoutError, RayActorError

        for i, actor in enumerate(a.actors):
            if i in a.codes:
                continue
            try:
                code = self.ray.get(actor.poll.remote(), timeout=10)
            except RayActorError:
                return AttemptExit(
                    a.job_id, a.attempt, None, True, f"node rank {i}'s Ray node died"
                )
            except GetTimeoutError:
                continue
            if code is not None:
                a.codes[i] = code
        if not a.codes:
            return None
        worst = max(a.codes.values(), key=lambda c: (c != 0, c))
        if worst == 0 and len(a.codes) < len(a.actors):
            return None
        return AttemptExit(a.job_id, a.attempt, worst, is_lost(worst), describe_exit(worst))

    def _cleanup(self, a: _RayAttempt, ended: AttemptExit) -> None:
        from ray.exceptions import RayActorError
        from ray.util import remove_placement_group

        for actor in a.actors:
            try:
                if ended.exit_code != 0:
                    self.ray.get(actor.stop.remote(), timeout=5)
                    self.ray.get(actor.kill_job.remote(), timeout=10)
                self.ray.kill(actor)
            except (RayActorError, self.ray.exceptions.GetTimeoutError):
                continue
        if ended.exit_code != 0:
            kill_job_processes(a.job_id)  # ranks this machine may still hold
        if a.pg is not None:
            remove_placement_group(a.pg)


def node_command(
    request: LaunchRequest, nnodes: int, rank: int, addr: str, port: int, run_dir: Path
) -> list[str]:
    """`argosy launch` for node rank `rank` of an attempt on `nnodes` nodes, or the
    request's own command."""
    if request.command:
        return list(request.command)
    command = [sys.executable, "-m", "argosy", "launch", "--quiet"]
    command += ["--nproc-per-node", str(request.nproc_per_node), "--run-dir", str(run_dir)]
    if nnodes > 1:
        command += ["--nnodes", str(nnodes), "--node-rank", str(rank)]
        command += ["--master-addr", addr, "--master-port", str(port)]
    if request.max_restarts is not None:
        command += ["--max-restarts", str(request.max_restarts)]
    for entry in request.inject:
        command += ["--inject", entry]
    return [*command, request.script, *request.args]
