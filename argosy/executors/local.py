"""The local executor: jobs run on this machine through `argosy launch`.

Each attempt is a small shell wrapper in its own session that runs
`python -m argosy launch --quiet --run-dir <run dir> ...` and writes the launcher's pid
and, at the end, its exit status into `<run dir>/server/attempt<N>/`. Nothing about a
running attempt lives only in the server's memory, so a restarted server adopts the
attempts that still run (same pid, same command line) and reads the exit status of
those that ended while it was down: no attempt is started twice.

The run directory is the same for every attempt of a job, so a new attempt resumes
from the checkpoints the previous one wrote (`argosy launch` and the job's script do
the resuming). When an attempt ends abnormally, its rank processes (which `argosy
launch` keeps in their own sessions) are found by the `ARGOSY_JOB_ID` in their
environment and killed, so a job never has two sets of ranks.

Devices: the accelerators device discovery reports (one node per chip type), or, on a
machine without any, `slots` CPU slots.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from argosy.core.procs import pid_alive, signal_by_env
from argosy.executors.base import AttemptExit, LaunchRequest, NodeInfo, describe_exit, is_lost
from argosy.hardware.discovery import discover

WRAPPER = r"""
"$@" > "$ARGOSY_ATTEMPT_DIR/output.log" 2>&1 &
echo $! > "$ARGOSY_ATTEMPT_DIR/launch.pid"
wait $!
echo $? > "$ARGOSY_ATTEMPT_DIR/exit.tmp"
mv "$ARGOSY_ATTEMPT_DIR/exit.tmp" "$ARGOSY_ATTEMPT_DIR/exit.code"
"""
JOB_ENV = "ARGOSY_JOB_ID"


@dataclass(frozen=True)
class LocalOptions:
    """How the local executor sees this machine."""

    slots: int = 0
    """CPU slots offered when no accelerator is found; 0 = the number of cores."""


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    dir: Path
    pid: int
    proc: subprocess.Popen | None  # None when adopted after a restart


def attempt_dir(run_dir: Path, attempt: int) -> Path:
    """Where the wrapper of one attempt keeps its pid, exit status and output."""
    return run_dir / "server" / f"attempt{attempt}"


class LocalExecutor:
    """Runs attempts as `argosy launch` processes on this machine."""

    name = "local"

    def __init__(self, options: LocalOptions | None = None) -> None:
        self.options = options or LocalOptions()
        self.host = socket.gethostname()
        self._running: dict[str, _Attempt] = {}

    def inventory(self) -> list[NodeInfo]:
        found = [d for d in discover() if d.catalog_id and d.backend != "cpu"]
        if not found:
            slots = self.options.slots or os.cpu_count() or 1
            return [NodeInfo(name=self.host, chip="cpu", devices=slots, address="127.0.0.1")]
        chips: dict[str, int] = {}
        for device in found:
            chips[str(device.catalog_id)] = chips.get(str(device.catalog_id), 0) + 1
        name = (lambda c: self.host) if len(chips) == 1 else (lambda c: f"{self.host}-{c}")
        return [NodeInfo(name(c), c, n, "127.0.0.1") for c, n in chips.items()]

    def start(self, request: LaunchRequest) -> None:
        older = self._running.pop(request.job_id, None)
        if older is not None:  # an older attempt never has company
            with contextlib.suppress(OSError):
                os.killpg(older.pid, signal.SIGKILL)  # wrapper and launcher (one group)
            kill_job_processes(request.job_id)  # ranks, in sessions of their own
        where = attempt_dir(request.run_dir, request.attempt)
        where.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ) | request.env
        env |= {JOB_ENV: request.job_id, "ARGOSY_ATTEMPT_DIR": str(where)}
        proc = subprocess.Popen(
            ["sh", "-c", WRAPPER, str(where), *launch_command(request)],
            cwd=request.workdir or None,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_for_exec(proc, where)
        (where / "wrapper.pid").write_text(str(proc.pid))
        self._running[request.job_id] = _Attempt(
            request.job_id, request.attempt, where, proc.pid, proc
        )

    def stop(self, job_id: str) -> None:
        current = self._running.get(job_id)
        if current is None:
            return
        pid = _read_int(current.dir / "launch.pid")
        if pid is not None and pid_alive(pid):
            _signal(pid, signal.SIGTERM)  # the launcher stops its ranks, then exits 130

    def poll(self) -> list[AttemptExit]:
        out = []
        for job_id, current in list(self._running.items()):
            ended = self._ended(current)
            if ended is not None:
                del self._running[job_id]
                out.append(ended)
        return out

    def adopt(self, job_id: str, attempt: int, run_dir: Path) -> AttemptExit | None:
        where = attempt_dir(run_dir, attempt)
        pid = _read_int(where / "wrapper.pid")
        current = _Attempt(job_id, attempt, where, pid or -1, None)
        ended = self._ended(current)
        if ended is None:
            self._running[job_id] = current
        return ended

    def _ended(self, a: _Attempt) -> AttemptExit | None:
        if a.proc is not None:
            if a.proc.poll() is None:
                return None
        elif a.pid > 0 and pid_alive(a.pid) and str(a.dir) in _cmdline(a.pid):
            return None
        code = _read_int(a.dir / "exit.code")
        lost = is_lost(code)
        if code != 0:
            kill_job_processes(a.job_id)
        return AttemptExit(a.job_id, a.attempt, code, lost, describe_exit(code))


def launch_command(request: LaunchRequest) -> list[str]:
    """The `argosy launch` command line of one attempt (single node), or the request's
    own command."""
    if request.command:
        return list(request.command)
    command = [sys.executable, "-m", "argosy", "launch", "--quiet"]
    command += ["--nproc-per-node", str(request.nproc_per_node)]
    command += ["--run-dir", str(request.run_dir)]
    if request.max_restarts is not None:
        command += ["--max-restarts", str(request.max_restarts)]
    return [*command, request.script, *request.args]


def kill_job_processes(job_id: str) -> int:
    """SIGKILL every process of this user whose environment names `job_id`; returns how
    many were signalled (rank processes a killed launcher left behind)."""
    hit = signal_by_env(JOB_ENV, job_id, signal.SIGKILL)
    if hit:
        time.sleep(0.05)
    return hit


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _wait_for_exec(proc: subprocess.Popen, where: Path, timeout_s: float = 5.0) -> None:
    """Return once the forked child runs the wrapper (its command line names the attempt
    directory) or has ended: until then it still looks like this process, and an adopting
    executor would take it for a stranger and the attempt for vanished."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and str(where) not in _cmdline(proc.pid):
        if time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
