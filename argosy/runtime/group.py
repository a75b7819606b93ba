"""A worker group: the rank processes of one attempt, started and stopped as one.

Ranks get torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, MASTER_ADDR/PORT, TORCHELASTIC_RESTART_COUNT, ...) plus the
argosy hooks' variables (ARGOSY_CKPT_DIR: the job's checkpoint store). Each rank runs in
its own session (process group), its stdout and stderr go to
`<run dir>/logs/attempt<N>/rank<R>.log`. Stopping never waits on a rank: SIGTERM to every
process group, SIGKILL to what is left after the grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from argosy.core.net import free_port
from argosy.runtime import hooks, warm


@dataclass
class GroupSpec:
    """What every attempt starts: the command and the shape of the group."""

    command: list[str]
    nproc_per_node: int
    run_dir: Path
    board_path: Path
    t0: float
    run_id: str
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    max_restarts: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    ckpt_dir: Path | None = None
    """The job's checkpoint store, the same path on every node (default: <run dir>/checkpoints)."""
    node_sizes: tuple[int, ...] = ()
    """Ranks on every node by node rank, where a placement gives nodes different numbers
    of devices (this node's entry is `nproc_per_node`); empty: `nproc_per_node` each."""

    @property
    def world_size(self) -> int:
        return sum(self.node_sizes) if self.node_sizes else self.nnodes * self.nproc_per_node

    @property
    def first_rank(self) -> int:
        """The global rank of this node's local rank 0."""
        if self.node_sizes:
            return sum(self.node_sizes[: self.node_rank])
        return self.node_rank * self.nproc_per_node

    @property
    def store(self) -> Path:
        return self.ckpt_dir or self.run_dir / "checkpoints"


def base_env() -> dict[str, str]:
    """What every rank and standby starts with: ours, unbuffered, one OpenMP thread."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def can_use_standby(command: list[str]) -> bool:
    """Standbys run Python scripts with this interpreter; anything else starts cold."""
    return len(command) >= 2 and command[0] == sys.executable and command[1].endswith(".py")


class WorkerGroup:
    """The live processes of one attempt; `standby` processes are used first when given."""

    def __init__(
        self,
        spec: GroupSpec,
        attempt: int,
        inject_env: Callable[[int], str],
        standby: list[subprocess.Popen] | None = None,
    ) -> None:
        self.spec = spec
        self.attempt = attempt
        self.log_dir = spec.run_dir / "logs" / f"attempt{attempt}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = spec.master_port + attempt if spec.master_port else free_port()
        self.epoch = time.time_ns() // 1000
        self.procs: list[subprocess.Popen] = []
        self.warm_started = 0
        standby = list(standby or [])
        for local in range(spec.nproc_per_node):
            rank = spec.first_rank + local
            env = self._env(rank, local, port, inject_env(rank))
            log = self.log_dir / f"rank{rank}.log"
            proc = standby.pop(0) if standby else None
            if proc is not None and warm.assign(
                proc, env=env, argv=spec.command[1:], cwd=os.getcwd(), log=log
            ):
                self.warm_started += 1
            else:
                proc = self._cold(env, log)
            self.procs.append(proc)
        for proc in standby:  # more standbys than ranks: release them
            proc.kill()
            proc.wait()
        self.first_rank = spec.first_rank

    def _cold(self, env: dict[str, str], log_path: Path) -> subprocess.Popen:
        with log_path.open("wb") as log:
            return subprocess.Popen(
                self.spec.command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _env(self, rank: int, local: int, port: int, inject_json: str) -> dict[str, str]:
        s = self.spec
        env = base_env()
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local),
            WORLD_SIZE=str(s.world_size),
            LOCAL_WORLD_SIZE=str(s.nproc_per_node),
            GROUP_RANK=str(s.node_rank),
            GROUP_WORLD_SIZE=str(s.nnodes),
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(s.world_size),
            ROLE_NAME="default",
            MASTER_ADDR=s.master_addr,
            MASTER_PORT=str(port),
            TORCHELASTIC_RESTART_COUNT=str(self.attempt),
            TORCHELASTIC_MAX_RESTARTS=str(s.max_restarts),
            TORCHELASTIC_RUN_ID=s.run_id,
            TORCHELASTIC_USE_AGENT_STORE="False",
            PYTHONUNBUFFERED="1",
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("ARGOSY_CKPT_JOB", s.run_id)  # flash snapshots named by this run
        if s.nnodes == 1:  # one clock: the attempt's checkpoint epoch (fences older ones)
            env["ARGOSY_CKPT_EPOCH"] = str(self.epoch)
        env.update(
            {
                hooks.ENV_BOARD: str(s.board_path),
                hooks.ENV_RUN_DIR: str(s.run_dir),
                hooks.ENV_CKPT_DIR: str(s.store),
                hooks.ENV_T0: repr(s.t0),
                hooks.ENV_ATTEMPT: str(self.attempt),
                hooks.ENV_INJECT: inject_json,
            }
        )
        env.update(s.extra_env)
        return env

    def ranks(self) -> list[int]:
        return [self.first_rank + i for i in range(len(self.procs))]

    def poll(self) -> dict[int, int | None]:
        """Exit code per rank (None while it runs; negative = killed by that signal)."""
        return {self.first_rank + i: p.poll() for i, p in enumerate(self.procs)}

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)

    def stop(self, grace_s: float, dump_stacks_s: float = 0.0) -> bool:
        """Stop every rank without waiting on any: TERM, then KILL. True if KILL was needed."""
        if dump_stacks_s > 0:
            self.signal_all(signal.SIGUSR1)
            time.sleep(dump_stacks_s)
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.02)
        killed = any(p.poll() is None for p in self.procs)
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            p.wait()
        for p in self.procs:  # children a rank left behind in its session
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        return killed

    def tail(self, lines: int = 5) -> dict[int, list[str]]:
        """The last lines each rank wrote, for reporting why it failed."""
        out = {}
        for rank in self.ranks():
            path = self.log_dir / f"rank{rank}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            out[rank] = [ln for ln in text.splitlines() if ln.strip()][-lines:]
        return out
