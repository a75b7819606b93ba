"""What runs on a Ray node for one node rank of an attempt.

`node_command` is the `argosy launch` of node rank i: one rank per device the placement
gave its node (`--node-sizes` where nodes got different counts), the job's one checkpoint
store, and `--max-restarts 0` for a gang (it restarts whole, through the server).
`NodeRunner` is the Ray actor that runs it as the job's environment allows, in a session
of its own that dies with the actor (`die_with_parent`: `prctl(PR_SET_PDEATHSIG)`), and
reports its exit code the shell's way (128 + signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from argosy.executors.base import LaunchRequest
from argosy.executors.isolation import job_environment
from argosy.executors.local import JOB_ENV, kill_job_processes

PR_SET_PDEATHSIG = 1


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
