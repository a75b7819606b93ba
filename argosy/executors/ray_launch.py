"""What runs on a Ray node for one node rank of an attempt.

`node_command` is the `argosy launch` of node rank i: one rank per device the placement
gave its node (`--node-sizes` where nodes got different counts), the job's one checkpoint
store, and `--max-restarts 0` for a gang (it restarts whole, through the server).
`NodeRunner` is the Ray actor that runs it as the job's environment allows, in a session
of its own that dies with the actor (`die_with_parent`: `prctl(PR_SET_PDEATHSIG)`), and
reports its exit code the shell's way (128 + signal). Where the actor may make cgroups
(`argosy.executors.cgroups`), the node rank runs in one of its own, and what it left
running there is killed once its launcher has ended (and by `kill_job`).

Who it runs as is decided on the node, by the server's settings (`NodeJob.users`) and the
actor's own rights: an actor that runs as root starts the launcher as the queue's job
user (`setpriv`, as the local executor does), made on that node with the server's uid
and gid for it (`NodeJob.ids`); the run directory is then root's with the job's
group (1770) and the attempt's records root's, so one tenant's job can neither read
another's run directory on the shared storage nor reach the raylet's files. An actor
that is not root runs it as itself (Ray's user), as a non-root local server does. A job
user's launcher starts, as on the local executor, under the server's rlimits and in mount
and IPC namespaces of its own with a fresh /dev/shm (`NodeJob.limits`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from argosy.executors.base import LaunchRequest
from argosy.executors.cgroups import JobCgroups, both
from argosy.executors.isolation import (
    JobUser,
    JobUsers,
    as_job_user,
    attempt_records,
    job_environment,
    launch_environment,
    prepare_run_dir,
)
from argosy.executors.limits import JobLimitsConfig, job_rlimits, with_rlimits
from argosy.executors.local import JOB_ENV, end_job
from argosy.executors.private_shm import private_prefix

PR_SET_PDEATHSIG = 1
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW


@dataclass(frozen=True)
class NodeJob:
    """What a node needs to run a node rank as its job's user: the job's run directory
    and queue, the server's job-user settings (None: as the actor's own user) and the
    environment names an operator lets jobs inherit (`job_env_allow`)."""

    run_dir: str
    queue: str | None = None
    users: JobUsers | None = None
    allow: tuple[str, ...] = ()
    ids: tuple[int, int] | None = None
    """The job user's uid and gid on the server's machine: every node uses those (made
    with them, or refusing to start where the name or the numbers are another's), so
    no queue name can be picked to get another queue's uid on some node."""
    limits: JobLimitsConfig | None = None
    """The server's job limits: a job user's launcher starts under their rlimits (each
    within this node's hard limits) and, with `private_shm`, in namespaces with its own
    /dev/shm and SysV IPC, as on the local executor; None: the defaults."""

    def user_here(self) -> JobUser | None:
        """The queue's job user on this node (made when missing), None: the actor's own."""
        if self.users is None:
            return None
        return self.users.here().for_queue(self.queue, self.ids)

    def legacy_here(self) -> JobUser | None:
        """The queue's user on this node under older names (`JobIdentity.legacy_for`)."""
        return self.users.here().legacy_for(self.queue) if self.users is not None else None


class NodeRunner:
    """Runs one node's `argosy launch` of an attempt; lives in a Ray actor."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.job_id = ""
        self.cgroups = JobCgroups.here()  # None: the environment scan alone ends a job
        self.run_dir = Path()
        self.part = ""  # this node rank's cgroup in the run directory's: `attempt<N>.node<i>`

    def start(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: str | None,
        log: str,
        job: NodeJob | None = None,
    ) -> int:
        """Start the node rank's launcher, its output appended to `log` (in the attempt's
        record directory); its pid."""
        self.job_id = env.get(JOB_ENV, "")
        user = job.user_here() if job is not None else None
        log_path = Path(log)
        if user is None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            full_env = job_environment(os.environ, env, allow=job.allow if job else ())
        else:
            run_dir = Path(job.run_dir)
            prepare_run_dir(run_dir, user, job.legacy_here())
            attempt_records(log_path.parent, user, log_path.name)
            full_env = launch_environment(os.environ, env, run_dir, user, job.allow)
        argv, workdir = as_job_user(user, command, cwd)  # never root's cwd
        if user is not None:  # as a local attempt: rlimits, and its own /dev/shm and IPC
            limits = (job.limits if job is not None else None) or JobLimitsConfig()
            argv = with_rlimits(argv, job_rlimits(limits))
            argv = [*(private_prefix() if limits.private_shm else []), *argv]
        self.run_dir = Path(job.run_dir) if job is not None else log_path.parents[2]
        self.part = f"{log_path.parent.name}.{log_path.stem}"
        entry = self.cgroups.enter(self.run_dir, self.part) if self.cgroups else None
        try:
            with os.fdopen(os.open(log_path, LOG_FLAGS, 0o600), "ab") as out:
                self.proc = subprocess.Popen(
                    argv,
                    env=full_env,  # the worker's allowed part, then ours
                    cwd=workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=both(die_with_parent(), entry),
                )
        except BaseException:
            if self.cgroups is not None:  # nothing started: the cgroup goes, empty
                self.cgroups.kill(self.run_dir, self.part)
            raise
        finally:
            if entry is not None:
                entry.close()
        return self.proc.pid

    def poll(self) -> int | None:
        """The launcher's exit code, None while it runs; once it has ended, whatever it
        left running in its cgroup ends too (after a success as well)."""
        assert self.proc is not None, "start first"
        code = self.proc.poll()
        if code is not None and self.cgroups is not None:
            self.cgroups.kill(self.run_dir, self.part)
        if code is not None and code < 0:
            return 128 - code  # killed by a signal: the shell's convention
        return code

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill_job(self) -> int:
        """SIGKILL every process of the job on this node: its cgroups', then any whose
        environment names the job."""
        return end_job(self.job_id, self.run_dir, self.cgroups) if self.job_id else 0


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


def node_command(
    request: LaunchRequest, nnodes: int, rank: int, addr: str, port: int, run_dir: Path
) -> list[str]:
    """`argosy launch` for node rank `rank` of an attempt on `nnodes` nodes, or the
    request's own command. Each node runs one rank per device the placement gave it (the
    scheduler packs a gang's nnodes x nproc_per_node devices onto as few nodes as hold
    them), with `--node-sizes` where nodes got different counts."""
    if request.command:
        return list(request.command)
    sizes = [int(n) for n in request.nodes.values()] or [request.nproc_per_node]
    command = [sys.executable, "-m", "argosy", "launch", "--quiet"]
    command += ["--nproc-per-node", str(sizes[rank]), "--run-dir", str(run_dir)]
    command += ["--ckpt-dir", str(request.run_dir / "checkpoints")]  # one store for all nodes
    if nnodes > 1:
        command += ["--nnodes", str(nnodes), "--node-rank", str(rank)]
        command += ["--master-addr", addr, "--master-port", str(port)]
        if len(set(sizes)) > 1:
            command += ["--node-sizes", ",".join(map(str, sizes))]
        command += ["--max-restarts", "0"]  # a gang restarts whole, through the server
    elif request.max_restarts is not None:
        command += ["--max-restarts", str(request.max_restarts)]
    for entry in request.inject:
        command += ["--inject", entry]
    return [*command, request.script, *request.args]
