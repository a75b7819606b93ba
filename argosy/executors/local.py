"""The local executor: jobs run on this machine through `argosy launch`.

Each attempt is a small shell wrapper in its own session that runs
`python -m argosy launch --quiet --run-dir <run dir> ...` and writes the launcher's pid
and, at the end, its exit status into `<run dir>/server/attempt<N>/` (each renamed into
place, so a file that exists is complete). Nothing about a
running attempt lives only in the server's memory, so a restarted server adopts the
attempts that still run (same pid, same command line) and reads the exit status of
those that ended while it was down: no attempt is started twice.

The run directory is the same for every attempt of a job, so a new attempt resumes
from the checkpoints the previous one wrote (`argosy launch` and the job's script do
the resuming). Each attempt runs in a cgroup of its own where this process may make
one (`argosy.executors.cgroups`: root, or a delegated cgroup): when the attempt ends,
whatever it left running there is killed, a process that left the job's session and
cleared its environment included. When an attempt ends abnormally, its rank processes
(which `argosy launch` keeps in their own sessions) are also found by the
`ARGOSY_JOB_ID` in their environment and killed, so a job never has two sets of ranks.

Devices (`argosy.executors.local_devices`): the accelerators device discovery reports
(one node per chip type), or, on a machine without any, `slots` CPU slots: one node, or
with `node_devices` nodes of that many devices or slots each (`<host>-0`, `<host>-1`,
...), so the scheduler can resize an elastic job and lend a service's device one node at
a time on one machine. An attempt placed on several of them runs all its ranks here
(`--nproc-per-node` = its devices). On accelerators each attempt holds device indices of
its own (`DeviceBook`) and sees only those (`CUDA_VISIBLE_DEVICES`, ...): two jobs on one
8-GPU host never share a GPU, and a job placed where a preempted one still checkpoints
waits (`devices_busy`) rather than start on its GPUs.

Isolation (`argosy.executors.isolation`): an attempt gets an allow-listed environment
(no `ARGOSY_HOME`, no tokens) with `HOME` its run directory; when `identity` names a user
for the job's queue (the server runs as root), the launcher runs as that user through
`setpriv` while the wrapper, which writes the attempt records, stays the server's. The
attempt records (`<run dir>/server/`, mode 0700) are then out of the job's reach: the run
directory is root's with the job's group and the sticky bit, so the job cannot rename
them away and plant its own pid files. Warm processes are kept per job user (the last
`WARM_USERS`): a queue's first attempt starts cold, its next ones warm, each already
running as that queue's user.

Limits (`argosy.executors.limits`): an attempt's cgroup gets its devices' share of this
machine (memory, CPU time, tasks) where the server may enable those controllers, and a
job user's processes start, cold or warm, under one set of rlimits. An attempt killed
over its memory limit fails with a reason that names the limit. Once a job user has had
no attempt here for a grace period, its warm process ends and what it left in /dev/shm,
/tmp and SysV IPC goes, removed by a process of that user (`argosy.executors.leftovers`),
started at a poll after the exits are read and never waited for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from argosy.core.procs import pid_alive, signal_by_env, start_ticks
from argosy.executors.base import AttemptExit, LaunchRequest, NodeInfo, describe_exit, is_lost
from argosy.executors.cgroups import KILL_WAIT_S, JobCgroups, join_cgroup
from argosy.executors.isolation import (
    JobIdentity,
    JobUser,
    as_job_user,
    attempt_records,
    job_environment,
    launch_environment,
    prepare_run_dir,
)
from argosy.executors.leftovers import LeftoverRemoval
from argosy.executors.limits import (
    UNLIMITED,
    HostSize,
    JobLimitsConfig,
    PartEnd,
    Rlimits,
    explain_exit,
    folder_limits,
    job_rlimits,
    part_limits,
    share_of,
    with_rlimits,
)
from argosy.executors.local_devices import LocalDevices
from argosy.executors.private_shm import private_prefix
from argosy.executors.warm_launcher import WarmLauncher
from argosy.hardware.discovery import discover

log = logging.getLogger(__name__)

NOT_JOINED = "cgroup.failed"
"""The file in an attempt's record directory (root's, `$0` of its wrapper) where a cold
wrapper names the cgroup it could not join."""


WRAPPER = (
    join_cgroup(f'echo "$1" > "$0/{NOT_JOINED}"')
    + r"""
"$@" > "$ARGOSY_ATTEMPT_DIR/output.log" 2>&1 &
echo $! > "$ARGOSY_ATTEMPT_DIR/launch.tmp"
mv "$ARGOSY_ATTEMPT_DIR/launch.tmp" "$ARGOSY_ATTEMPT_DIR/launch.pid"
wait $!
echo $? > "$ARGOSY_ATTEMPT_DIR/exit.tmp"
mv "$ARGOSY_ATTEMPT_DIR/exit.tmp" "$ARGOSY_ATTEMPT_DIR/exit.code"
"""
)
JOB_ENV = "ARGOSY_JOB_ID"
WARM_USERS = 4
"""Warm processes kept at most: one per recently started job user (a queue's)."""
IN_LOOP_KILL_WAIT_S = 0.25
"""How long ending an attempt waits for its cgroup to empty: the server's control loop
waits with it (a member stuck in the kernel, which a job can cause, would hold the loop
for the full KILL_WAIT_S at each end); an emptied cgroup left behind goes at the next
sweep."""
SWEEP_EVERY_S = 300.0
LAUNCHER_START_S = 60
"""A launcher starts this soon after its wrapper, or the pid its file names is a stranger's."""


JOB_UID = "job.uid"
"""The file in an attempt's record directory naming the uid its job runs as (a job user's)."""


def with_job_limits(
    argv: list[str], user: object | None, rlimits: Rlimits | None = None
) -> list[str]:
    """`argv` (the user switch and the job's command) run under `prlimit`, which sets the
    job's RLIMIT_NPROC, RLIMIT_NOFILE and RLIMIT_FSIZE (`limits.job_rlimits`; default: the
    default config's) before the switch (a job cannot raise them: it runs without
    privileges); unchanged for a job that runs as the server's own user, or where
    `prlimit` is not installed. A warm launcher's process starts under the same."""
    if user is None:
        return argv
    return with_rlimits(argv, rlimits or job_rlimits(JobLimitsConfig()))


@dataclass(frozen=True)
class LocalOptions:
    """How the local executor sees this machine."""

    slots: int = 0
    """CPU slots offered when no accelerator is found; 0 = the number of cores."""
    warm: bool = False
    """Keep one warm `argosy` process ready (`argosy.executors.warm`): an attempt then
    skips the CLI's imports."""
    node_devices: int = 0
    """Split the CPU slots, or each chip type's accelerators, into nodes of this many
    (0: one node)."""
    identity: JobIdentity | None = None
    """Which user each queue's jobs run as; None: the server's own user."""
    env_allow: tuple[str, ...] = ()
    """Extra environment names (fnmatch patterns) jobs inherit from the server."""
    limits: JobLimitsConfig = field(default_factory=JobLimitsConfig)
    """What each attempt may use of this machine, and whether a job user's leftovers go."""


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    dir: Path
    pid: int
    proc: subprocess.Popen | None  # None when adopted after a restart
    uid: int | None = None  # the job user's; None: the server's own user


def attempt_dir(run_dir: Path, attempt: int) -> Path:
    """Where the wrapper of one attempt keeps its pid, exit status and output."""
    return run_dir / "server" / f"attempt{attempt}"


class LocalExecutor:
    """Runs attempts as `argosy launch` processes on this machine."""

    name = "local"
    lends_sleeping = True
    fixed_inventory = True
    """Its nodes are this machine's slots as configured: none is ever lost, and a node
    of an earlier configuration is gone, not down (the server does not keep it)."""

    def __init__(
        self, options: LocalOptions | None = None, *, leftovers: LeftoverRemoval | None = None
    ) -> None:
        self.options = options or LocalOptions()
        self._leftovers = leftovers or LeftoverRemoval()
        identity = self.options.identity
        if self.options.limits.remove_leftovers and identity is not None and identity.active:
            self._leftovers.idle_from_now(identity.names)  # idle when the last server stopped
        self.host = socket.gethostname()
        opts = self.options
        self.devices = LocalDevices(self.host, opts.slots, opts.node_devices, discover)
        self._running: dict[str, _Attempt] = {}
        self._warm: OrderedDict[JobUser | None, WarmLauncher] = OrderedDict()
        self.cgroups = JobCgroups.here()  # None: the environment scan alone ends a job
        self._swept_s = time.monotonic()
        self.rlimits = job_rlimits(self.options.limits)
        self._host = HostSize.here()
        if self.cgroups is not None:
            self._set_up_limits(self.cgroups)
        identity = self.options.identity
        self._private = self._private_shm(identity)
        if self.options.warm and (identity is None or not identity.active):
            self._warm[None] = WarmLauncher(self._warm_env(None), None, self.cgroups)

    def _private_shm(self, identity: JobIdentity | None) -> list[str]:
        """The prefix giving a job user's attempts their own /dev/shm and SysV IPC
        (`private_shm`); said once when it cannot be had."""
        if identity is None or not identity.active or not self.options.limits.private_shm:
            return []
        prefix = private_prefix()
        if not prefix:
            log.warning(
                "job users' attempts share /dev/shm and SysV IPC: no private namespaces here"
            )
        return prefix

    def _set_up_limits(self, cgroups: JobCgroups) -> None:
        """Controllers enabled and the jobs' folder capped (or, with limits off, a cap an
        earlier start left lifted); a controller that cannot be had is said once here."""
        config = self.options.limits
        if not config.enabled:
            cgroups.limit(UNLIMITED, enable=False)
            return
        note = cgroups.limit(folder_limits(self._host, config).files()).note()
        if note is not None:
            log.warning(note)

    def _part_limits(self, request: LaunchRequest) -> dict[str, str] | None:
        """The attempt's cgroup limits: its devices' share of this machine."""
        if self.cgroups is None or not self.cgroups.controllers:
            return None
        host_devices = sum(n.devices for n in self.inventory())  # (discovery read once)
        share = share_of(sum(request.nodes.values()) or 1, host_devices)
        return part_limits(share, self._host, self.options.limits).files()

    def inventory(self) -> list[NodeInfo]:
        return self.devices.inventory()

    def devices_busy(self, nodes: dict[str, int]) -> bool:
        return self.devices.busy(nodes)

    def devices_of(self, job_id: str) -> str:
        return self.devices.seen(job_id)

    def lend(self, job_id: str) -> None:
        self.devices.book.lend(job_id)

    def take_back(self, job_id: str) -> bool:
        return self.devices.book.take_back(job_id)

    def start(self, request: LaunchRequest) -> None:
        older = self._running.pop(request.job_id, None)
        if older is not None:  # an older attempt never has company
            if older.proc is not None or _same_process(older.pid, older.dir):
                with contextlib.suppress(OSError):  # (an adopted pid may be a stranger's)
                    os.killpg(older.pid, signal.SIGKILL)  # wrapper and launcher (one group)
            end_job(request.job_id, request.run_dir, self.cgroups, wait_s=IN_LOOP_KILL_WAIT_S)
        user = self.user_for(request.queue)
        self._leftovers.started(user.uid if user else None)  # none of its files go meanwhile
        prepare_run_dir(request.run_dir, user, self.legacy_for(request.queue))
        where = attempt_dir(request.run_dir, request.attempt)
        attempt_records(where, user)
        visible = self.devices.take(request.job_id, request.nodes, where)  # or DevicesBusyError
        try:
            self._spawn(request, user, where, visible)
        except BaseException:
            self.devices.book.release(request.job_id)  # nothing runs on them
            raise

    def _spawn(
        self, request: LaunchRequest, user: JobUser | None, where: Path, visible: dict[str, str]
    ) -> None:
        """Start the attempt's wrapper (cold) or hand it to a warm process."""
        extra = request.env | {JOB_ENV: request.job_id, "ARGOSY_ATTEMPT_DIR": str(where)}
        env = self.environment(extra | visible, request.run_dir, user)
        command = launch_command(request)
        warm = self._warm.get(user)
        part = f"a{request.attempt}"  # the attempt's cgroup: all it starts ends with it
        limits = self._part_limits(request)
        if self.cgroups is not None and limits:  # limited before anything joins, cold or warm
            self.cgroups.make(request.run_dir, part, limits)
        if user is not None:  # whose leftovers go once it is idle here (read after a restart)
            (where / JOB_UID).write_text(str(user.uid))
        proc = None
        if warm is not None and command[:3] == [sys.executable, "-m", "argosy"]:
            self._warm.move_to_end(user)
            adopt = partial(self.cgroups.adopt, request.run_dir, part) if self.cgroups else None
            proc = warm.take(command[3:], env, request.workdir, where, adopt)
        if proc is None:  # no warm process, or one that could not be confined: cold
            argv, cwd = as_job_user(user, command, request.workdir)  # never root's cwd
            argv = with_job_limits(argv, user, self.rlimits)
            if user is not None:
                argv = [*self._private, *argv]
            procs = self.cgroups.make(request.run_dir, part) if self.cgroups else None
            proc = subprocess.Popen(  # the wrapper joins the cgroup before it starts anything
                ["sh", "-c", WRAPPER, str(where), str(procs or ""), *argv],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _wait_for_exec(proc, where)
        (where / "wrapper.pid").write_text(str(proc.pid))
        (where / "wrapper.start").write_text(str(start_ticks(proc.pid)))
        self._running[request.job_id] = _Attempt(
            request.job_id, request.attempt, where, proc.pid, proc, user.uid if user else None
        )
        if self.options.warm and user is not None and user not in self._warm:
            self._keep_warm(user)  # this queue's next attempt starts warm

    def _warm_env(self, user: JobUser | None) -> dict[str, str]:
        return job_environment(os.environ, {}, allow=self.options.env_allow, user=user)

    def _keep_warm(self, user: JobUser) -> None:
        """A warm process for `user`; the least recently used one goes past WARM_USERS."""
        self._warm[user] = WarmLauncher(
            self._warm_env(user), user, self.cgroups, self.rlimits, self._private
        )
        while len(self._warm) > WARM_USERS:
            _, oldest = self._warm.popitem(last=False)
            oldest.close()

    def user_for(self, queue: str | None) -> JobUser | None:
        """The user a job of `queue` runs as (None: this process's own)."""
        identity = self.options.identity
        return identity.for_queue(queue) if identity is not None else None

    def legacy_for(self, queue: str | None) -> JobUser | None:
        """The queue's user under older names, whose run directories are handed over."""
        identity = self.options.identity
        return identity.legacy_for(queue) if identity is not None else None

    def environment(
        self, extra: dict[str, str], run_dir: Path, user: JobUser | None
    ) -> dict[str, str]:
        """A job's whole environment: the allowed part of ours, then `extra`."""
        return launch_environment(os.environ, extra, run_dir, user, self.options.env_allow)

    def stop(self, job_id: str) -> None:
        current = self._running.get(job_id)
        if current is None:
            return
        pid = launcher_pid(current.dir)
        if pid is not None:
            _signal(pid, signal.SIGTERM)  # the launcher stops its ranks, then exits 130

    def poll(self) -> list[AttemptExit]:
        if self.cgroups is not None and time.monotonic() - self._swept_s > SWEEP_EVERY_S:
            self._swept_s = time.monotonic()
            self.cgroups.sweep()  # what an end left behind, still busy, once empty
        out, ended_uids = [], []
        for job_id, current in list(self._running.items()):
            ended = self._ended(current)
            if ended is not None:
                del self._running[job_id]
                self.devices.book.release(job_id)
                ended_uids.append(current.uid)
                out.append(ended)
        self._tend_leftovers(ended_uids)
        return out

    def _tend_leftovers(self, ended_uids: list[int | None]) -> None:
        """What job users left in /dev/shm, /tmp and SysV IPC (`argosy.executors.leftovers`):
        removals that ended are read, and one starts for each job user idle here for the
        grace period, once its warm process has ended (at an earlier poll: that process
        must be gone when the removal looks for its user's processes). Never raises: the
        exits of this poll are reported whatever happens here."""
        if not self.options.limits.remove_leftovers:
            return
        try:
            for uid in ended_uids:
                self._leftovers.ended(uid)
            self._leftovers.reap()
            busy = {a.uid for a in self._running.values()}
            for uid in self._leftovers.due(busy):
                if not self._close_warm(uid):
                    self._leftovers.start(uid)
        except Exception:  # a bug here must not cost the exits this poll read
            log.exception("tending job users' leftovers failed; tried again at the next poll")

    def _close_warm(self, uid: int) -> bool:
        """End the job user `uid`'s warm process and its holding cgroup; False: it had none."""
        user = next((u for u in self._warm if u is not None and u.uid == uid), None)
        if user is None:
            return False
        self._warm.pop(user).close()
        return True

    def adopt(self, job_id: str, attempt: int, run_dir: Path) -> AttemptExit | None:
        where = attempt_dir(run_dir, attempt)
        pid = _read_int(where / "wrapper.pid")
        uid = _read_int(where / JOB_UID)
        if uid is None:  # an attempt started before `job.uid` was written
            uid = _log_owner(where)
        current = _Attempt(job_id, attempt, where, pid or -1, None, uid)
        ended = self._ended(current)
        if ended is None:
            self._running[job_id] = current
            self.devices.adopt(job_id, where)
        else:  # ended while the server was down: its user's leftovers count too
            self._tend_leftovers([uid])
        return ended

    def _ended(self, a: _Attempt) -> AttemptExit | None:
        if a.proc is not None:
            if a.proc.poll() is None:
                return None
        elif a.pid > 0 and pid_alive(a.pid) and _same_process(a.pid, a.dir):
            return None
        code = _read_int(a.dir / "exit.code")
        lost = is_lost(code)
        run_dir, wait_s = a.dir.parent.parent, IN_LOOP_KILL_WAIT_S
        # what the limits did to it, read before its cgroup goes
        end = self.cgroups.part_end(run_dir, f"a{a.attempt}") if self.cgroups else PartEnd()
        # whatever the attempt left running ends with it (after a success too: a process
        # that left the job's session would keep the machine's CPU and memory)
        end_job(a.job_id, run_dir, self.cgroups, scan=code != 0, wait_s=wait_s)
        unjoined = _read_text(a.dir / NOT_JOINED)
        if unjoined:  # its wrapper started nothing
            why = f"could not start: its wrapper could not join the cgroup {unjoined}"
            return AttemptExit(a.job_id, a.attempt, None, True, why)
        told = AttemptExit(a.job_id, a.attempt, code, lost, describe_exit(code))
        return explain_exit(told, end)

    def close(self) -> None:
        """End the warm processes that wait and the leftover removals under way (running
        attempts are left alone)."""
        for warm in self._warm.values():
            warm.close()
        self._warm.clear()
        self._leftovers.close()


def launch_command(request: LaunchRequest) -> list[str]:
    """The `argosy launch` command line of one attempt (single node), or the request's
    own command."""
    if request.command:
        return list(request.command)
    command = [sys.executable, "-m", "argosy", "launch", "--quiet"]
    ranks = sum(request.nodes.values()) or request.nproc_per_node  # every node is this host
    command += ["--nproc-per-node", str(ranks)]
    command += ["--run-dir", str(request.run_dir)]
    if request.max_restarts is not None:
        command += ["--max-restarts", str(request.max_restarts)]
    for entry in request.inject:
        command += ["--inject", entry]
    return [*command, request.script, *request.args]


def kill_job_processes(job_id: str) -> int:
    """SIGKILL every process of this user whose environment names `job_id`; returns how
    many were signalled (rank processes a killed launcher left behind)."""
    hit = signal_by_env(JOB_ENV, job_id, signal.SIGKILL)
    if hit:
        time.sleep(0.05)
    return hit


def end_job(
    job_id: str,
    run_dir: Path,
    cgroups: JobCgroups | None,
    *,
    scan: bool = True,
    wait_s: float = KILL_WAIT_S,
) -> int:
    """SIGKILL what a job runs on this machine: its cgroups' members (none can leave
    them; waiting at most `wait_s` for each cgroup to empty), then with `scan` every
    process whose environment names `job_id` (the only way where there are no cgroups).
    Returns how many were signalled."""
    hit = cgroups.kill(run_dir, wait_s=wait_s) if cgroups is not None else 0
    return hit + (kill_job_processes(job_id) if scan else 0)


def launcher_pid(where: Path) -> int | None:
    """The pid of the attempt's launcher while that process runs, else None. The pid file
    outlives its process, and pids wrap: the one it names counts only if that process
    started within LAUNCHER_START_S of the attempt's wrapper (its parent, cold or warm)."""
    pid, wrapper_start = _read_int(where / "launch.pid"), _read_int(where / "wrapper.start")
    if pid is None or wrapper_start is None or not pid_alive(pid):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return pid if 0 <= start_ticks(pid) - wrapper_start <= LAUNCHER_START_S * ticks else None


def kill_leftovers(runs: Path) -> int:
    """SIGKILL what a stopped server's attempts left running under `runs` (its
    `<home>/runs`): each attempt's launcher first (a warm-started one does not carry the job
    id in its environment, and would restart a rank killed before it), then the ranks of
    each job and service replica. Returns how many were signalled; never a stranger."""
    hit = 0
    found = [*runs.glob("*/server/attempt*"), *runs.glob("*/r*/server/attempt*")]
    for where in filter(_ours, found):  # a job can plant look-alikes in its run directory
        pid = launcher_pid(where)
        if pid is not None:
            _signal(pid, signal.SIGKILL)
            hit += 1
    cgroups = JobCgroups.here()
    for run in runs.glob("*"):
        hit += end_job(run.name, run, cgroups)
        for replica in run.glob("r*"):
            hit += end_job(f"{run.name}.{replica.name}", replica, cgroups)
    return hit


def _ours(attempt: Path) -> bool:
    """Whether an attempt directory and its `server` directory are real directories of
    this process's user (the server's records), not a job's look-alikes or links."""
    for path in (attempt.parent, attempt):
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return False
    return True


def _log_owner(where: Path) -> int | None:
    """The owner of the attempt's output log where it is not this process: its job user
    (`attempt_records` hands the log over; the job cannot re-own it), else None."""
    try:
        owner = os.lstat(where / "output.log").st_uid
    except OSError:
        return None
    return None if owner == os.geteuid() else owner


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_text(path: Path) -> str:
    """The file's text, stripped ("" where there is none)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _wait_for_exec(proc: subprocess.Popen, where: Path, timeout_s: float = 5.0) -> None:
    """Return once the forked child runs the wrapper (its command line names the attempt
    directory) or has ended: until then it still looks like this process, and an adopting
    executor would take it for a stranger and the attempt for vanished."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and str(where) not in _cmdline(proc.pid):
        if time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _same_process(pid: int, where: Path) -> bool:
    """Whether `pid` is still the wrapper of the attempt in `where` (not a process that
    reuses its pid): its command line names the attempt, or it started when recorded."""
    if str(where) in _cmdline(pid):
        return True
    recorded = _read_int(where / "wrapper.start")
    return recorded is not None and recorded == start_ticks(pid)


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
