"""Warm launchers: an `argosy.executors.warm` process per job user, importing ahead of
time, that becomes an attempt's `argosy launch` when the local executor hands it one.

    warm = WarmLauncher(env, user, cgroups, rlimits)   # starts waiting at once
    proc = warm.take(argv, env, workdir, where, adopt)   # its wrapper, or None: start cold
    warm.close()

Each waits under a small shell wrapper (`WARM_WRAPPER`) that records, like a cold
attempt's, the launcher's pid and exit status in the attempt's record directory. With
cgroups, it waits in a holding cgroup of its own, joined by its wrapper before anything
starts (a wrapper that cannot join ends at once, and `take` then says to start cold).
A job user's waiting process starts under `prlimit` with the job's rlimits, as a cold
start's launcher does (`limits.job_rlimits`), so the attempt it becomes runs under them.

A process of the same user can attach to the waiting one (ptrace) in the moment between
its start and its `not_dumpable()`, and run code in it. So `take` hands an attempt only to
one that has made itself non-dumpable (none can attach from then on) and has no tracer;
any other is killed, and the attempt starts cold. (A tracer that attached in that moment
and has let go again is not seen: what it started there stays in the holding cgroup,
moves with it into the attempt's cgroup, and ends with the attempt or at `close`.)
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from argosy.executors.cgroups import JobCgroups, join_cgroup, kill_group
from argosy.executors.isolation import JobUser
from argosy.executors.limits import JobLimitsConfig, Rlimits, job_rlimits, with_rlimits

END_WAIT_S = 0.25
"""How long ending a waiting process waits for its wrapper, then for its holding cgroup
to empty (the server's loop waits with it)."""

JOIN_WAIT_S = 2.0
"""How long a take waits for a waiting process's wrapper to join its holding cgroup, and
then for the waiting process to make itself non-dumpable, before it gives up on it (the
attempt then starts cold)."""
WARM_COMMAND = [sys.executable, "-m", "argosy.executors.warm"]

WARM_WRAPPER = (
    join_cgroup(":")  # the waiting process never starts: its attempt starts cold
    + r"""
"$@" > /dev/null 2>&1 &
child=$!
trap '' PIPE
echo $child
if ! read -r ARGOSY_ATTEMPT_DIR; then kill $child 2>/dev/null; exit 0; fi
echo $child > "$ARGOSY_ATTEMPT_DIR/launch.tmp"
mv "$ARGOSY_ATTEMPT_DIR/launch.tmp" "$ARGOSY_ATTEMPT_DIR/launch.pid"
wait $child
echo $? > "$ARGOSY_ATTEMPT_DIR/exit.tmp"
mv "$ARGOSY_ATTEMPT_DIR/exit.tmp" "$ARGOSY_ATTEMPT_DIR/exit.code"
"""
)


class WarmLauncher:
    """One `argosy.executors.warm` process under a wrapper, importing ahead of time;
    `take` hands it an attempt and starts the next one.

    With `cgroups`, each is born in a holding cgroup of its own (its wrapper joins before
    it starts anything), so whatever reaches it while it waits (a job of the same user
    that attaches to it) stays in there: `take` moves the whole holding cgroup into the
    attempt's, and `close` kills it."""

    def __init__(
        self,
        env: dict[str, str],
        user: JobUser | None = None,
        cgroups: JobCgroups | None = None,
        rlimits: Rlimits | None = None,
        private: list[str] | None = None,
    ) -> None:
        self._env = env  # what the process starts with: already a job's allowed environment
        self._prefix: list[str] = []
        if user is not None:  # it runs as the job's user, under the job's rlimits, in
            limits = rlimits or job_rlimits(JobLimitsConfig())  # its own /dev/shm (`private`)
            self._prefix = [*(private or []), *with_rlimits(user.setpriv(), limits)]
        self._cgroups = cgroups
        self._proc, self._pipe, self._held = self._spawn()

    def _spawn(self) -> tuple[subprocess.Popen, int, Path | None]:
        held = self._cgroups.holding() if self._cgroups is not None else None
        read_fd, write_fd = os.pipe()
        command = [*WARM_COMMAND, "--fd", str(read_fd)]
        proc = subprocess.Popen(  # its first line out: the waiting process's pid
            ["sh", "-c", WARM_WRAPPER, "warm", str(held or ""), *self._prefix, *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self._env,
            pass_fds=(read_fd,),
            start_new_session=True,
        )
        os.close(read_fd)
        return proc, write_fd, held

    def take(
        self,
        argv: list[str],
        env: dict[str, str],
        workdir: str | None,
        where: Path,
        adopt: Callable[[Path], bool] | None = None,
    ) -> subprocess.Popen | None:
        """Run `argosy <argv>` as the attempt recorded in `where`; returns its wrapper.
        The waiting process must be non-dumpable and untraced (`_ready`); `adopt` then
        moves its holding cgroup into the attempt's, before it hears of the attempt. None
        when either fails (the waiting process is killed: the caller starts cold)."""
        proc, pipe, held = self._proc, self._pipe, self._held
        self._proc, self._pipe, self._held = self._spawn()
        usable = proc.poll() is None  # (it ends at once where it cannot join its cgroup)
        usable = usable and (held is None or _joined(proc, held))
        pid, ready = _ready(proc) if usable else (None, False)
        if not ready or (adopt is not None and (held is None or not adopt(held))):
            _end_waiting(proc, pipe, held, pid)
            return None
        request = {"argv": argv, "env": env, "cwd": workdir, "output": str(where / "output.log")}
        try:
            os.write(pipe, (json.dumps(request) + "\n").encode())
            assert proc.stdin is not None
            proc.stdin.write(f"{where}\n".encode())
            proc.stdin.close()
        except BrokenPipeError:  # it ended meanwhile: nothing started, start cold
            _end_waiting(proc, pipe, None, pid)
            return None
        os.close(pipe)
        _close(proc.stdout)
        deadline = time.monotonic() + 5.0
        while not (where / "launch.pid").exists() and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.002)
        return proc

    def close(self) -> None:
        """End the waiting process, and whatever reached it, for good."""
        _end_waiting(self._proc, self._pipe, self._held)


def _joined(proc: subprocess.Popen, held: Path, wait_s: float = JOIN_WAIT_S) -> bool:
    """Whether the wrapper `proc` is in its holding cgroup (`held`: its `cgroup.procs`).
    It joins as its first step, which a take soon after its spawn (the next start of the
    same user) can come before: moving the holding cgroup then would move nothing, and
    the wrapper, joining later, would run the attempt outside the attempt's cgroup."""
    deadline = time.monotonic() + wait_s
    while proc.poll() is None:
        try:
            if str(proc.pid) in held.read_text().split():
                return True
        except OSError:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return False


def _ready(proc: subprocess.Popen, wait_s: float = JOIN_WAIT_S) -> tuple[int | None, bool]:
    """The pid of the process waiting under the wrapper `proc` (None: unknown), and
    whether it may take an attempt: it runs `WARM_COMMAND`, has made itself non-dumpable
    (its /proc files are then root's: no process of its user can attach from then on) and
    has no tracer (`TracerPid` 0). Not when it has one, or is not so within `wait_s`."""
    deadline = time.monotonic() + wait_s
    pid = _waiting_pid(proc, wait_s)
    while pid is not None and proc.poll() is None:
        command = _cmdline(pid)  # read first: a status read after it is the command's
        status, owner = _status(pid)
        if not _child_of(proc, status):
            return None, False  # gone (and reaped)
        if command[: len(WARM_COMMAND)] == WARM_COMMAND and owner == 0:
            return pid, _field(status, "TracerPid") == "0"
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    return pid, False


def _waiting_pid(proc: subprocess.Popen, wait_s: float) -> int | None:
    """The pid of the waiting process, as its wrapper said it on its first line (None: it
    said nothing within `wait_s`, or it has been read already)."""
    if proc.stdout is None or proc.stdout.closed:
        return None
    ready, _, _ = select.select([proc.stdout], [], [], wait_s)
    line = proc.stdout.readline() if ready else b""  # one write by the wrapper: whole
    try:
        return int(line)
    except ValueError:
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def _status(pid: int) -> tuple[str, int]:
    """The text of `/proc/<pid>/status` and the file's owner ("" and -1: gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read(), os.fstat(f.fileno()).st_uid
    except OSError:
        return "", -1


def _child_of(proc: subprocess.Popen, status: str) -> bool:
    """Whether a /proc status text is of a child of `proc`."""
    return _field(status, "PPid") == str(proc.pid)


def _field(status: str, name: str) -> str | None:
    """The first word after `name:` on its line of a /proc status text."""
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.split()[0] if value.split() else ""
    return None


def _close(stream: IO[bytes] | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()


def _end_waiting(
    proc: subprocess.Popen, pipe: int, held: Path | None, pid: int | None = None
) -> None:
    """A waiting warm process (`pid`, else as its wrapper said) ends: SIGKILL (a tracer
    could hold back a gentler signal), EOF on its pipes (its wrapper then exits 0), then
    its holding cgroup is killed, with whatever else reached it."""
    pid = pid if pid is not None else _waiting_pid(proc, 0.0)
    if pid is not None and proc.poll() is None and _child_of(proc, _status(pid)[0]):
        with contextlib.suppress(OSError):  # its wrapper's child, unreaped: still its pid
            os.kill(pid, signal.SIGKILL)
    _close(proc.stdout)
    with contextlib.suppress(OSError):
        os.close(pipe)
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if held is not None:  # (without one, it ends by itself on EOF, unwaited)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=END_WAIT_S)
        kill_group(held.parent, END_WAIT_S)
