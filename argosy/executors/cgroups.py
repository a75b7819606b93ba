"""One cgroup (v2) per job part on this machine, so that nothing a job starts outlives it.

A job's processes used to be found only by `ARGOSY_JOB_ID` in their environment
(`kill_job_processes`), which a process clears with `setsid env -i ...`: it then kept
the node's CPU and memory after its job ended. A process cannot leave its cgroup
without write access to another one, and the cgroups here are the server's (root's):
every process a job starts, in any session, with any environment, is in its cgroup,
and `kill` ends them all at once (`cgroup.kill`, Linux 5.14; else SIGKILL to each
member until none is left).

    groups = JobCgroups.here()       # None: no cgroup v2 this process may write
    entry = groups.enter(run_dir, "a1")
    child = subprocess.Popen(..., preexec_fn=entry)
    entry.close()
    groups.kill(run_dir)             # every part of that run directory's job

Cgroups live under this process's own cgroup, in `argosy-jobs/`, named after the run
directory (its name and a hash of its path: two servers on one machine never share
one) and the part (an attempt, a node rank). A server that moved into its leaf
`argosy-server/` (`cgroup_controllers`) keeps `argosy-jobs/` beside it, in the cgroup
it came from. Where there is no cgroup2 mount, or this process may not create cgroups
in its own (not root, no delegation, a read-only mount), `here()` is None and the
environment scan alone remains.

Limits: `limit(folder)` enables the `pids`, `memory` and `cpu` controllers down to the
parts where the hierarchy allows (`cgroup_controllers.enable_controllers`) and caps the
whole folder; `make(..., limits)` then writes a part's `pids.max`, `memory.max`,
`memory.swap.max` and `cpu.weight` before anything joins it, and `part_end` reads what the
kernel did (OOM kills, refused forks) before the part is killed and removed. Without
those controllers (a hybrid v1/v2 host, a cgroup not delegated) the cgroups group and
kill; they do not limit.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from argosy.core.procs import pid_alive
from argosy.executors.cgroup_controllers import (
    CONTROLLERS,
    SERVER_LEAF,
    Enabled,
    enable_controllers,
    read_end,
    write_limits,
)
from argosy.executors.limits import PartEnd

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUP = Path("/proc/self/cgroup")
FOLDER = "argosy-jobs"
KILL_WAIT_S = 2.0
"""How long `kill` waits for the members to be gone before it leaves the cgroup."""
MOVE_ROUNDS = 20
"""Reads of a holding cgroup's members that `adopt` makes at most while they fork."""
SWEEP_AFTER_S = 300.0
"""Empty cgroups younger than this are not swept: a child may be about to enter one."""
HOLDING = "warm-"
"""The name of a holding cgroup: `warm-<server pid>-<n>`."""
_HELD = itertools.count(1)


def cgroup2_mount(mountinfo: str) -> Path | None:
    """The mount point of the cgroup2 hierarchy in a `/proc/self/mountinfo` text."""
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        if rest.split(" ", 1)[0] == "cgroup2":
            return Path(_unescape(fields.split()[4]))
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup2 path (`0::<path>`) in a `/proc/self/cgroup` text."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


def own_cgroup_path() -> tuple[Path, str] | None:
    """(the cgroup2 mount, this process's cgroup path in it); None where there is none."""
    try:
        mount = cgroup2_mount(MOUNTINFO.read_text())
        own = own_cgroup(OWN_CGROUP.read_text())
    except OSError:
        return None
    return None if mount is None or own is None else (mount, own)


def _unescape(path: str) -> str:
    """Mountinfo's octal escapes (`\\040` for a space) undone."""
    return path.encode().decode("unicode_escape") if "\\" in path else path


def group_key(run_dir: Path) -> str:
    """The prefix of a run directory's cgroups: its name (in characters no glob reads
    as a pattern) and a hash of its path."""
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', run_dir.name[:64])}-{digest}"


class JobCgroups:
    """The `argosy-jobs` folder of cgroups under this process's own cgroup."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.controllers: frozenset[str] = frozenset()
        """The controllers the parts have (`limit`); none: parts are not limited."""

    @classmethod
    def here(cls) -> JobCgroups | None:
        """The folder where this process may make job cgroups, made when missing; None
        where there is no cgroup2 hierarchy or it may not write there."""
        found_here = own_cgroup_path()
        if found_here is None:
            return None
        mount, own = found_here
        base = own.rstrip("/").removesuffix(f"/{SERVER_LEAF}")  # moved into its leaf
        root = mount / base.lstrip("/") / FOLDER
        try:
            root.mkdir(exist_ok=True)
        except OSError:
            return None
        if not (root / "cgroup.procs").exists() or not _joinable(root):
            return None
        found = cls(root)
        found.kill_stale()
        found.sweep()
        return found

    def limit(self, folder: Mapping[str, str], enable: bool = True) -> Enabled:
        """Enable the `pids`, `memory` and `cpu` controllers for the parts where the
        hierarchy allows, and cap the whole folder with `folder` (file -> value): what
        every job here together may use. Which controllers the parts have, and why the
        others are missing (said once in the log by the caller). Without `enable`, the
        parts get no limits, and `folder` (`limits.UNLIMITED`) lifts an earlier cap."""
        enabled = enable_controllers(self.root) if enable else Enabled(frozenset())
        self.controllers = enabled.controllers
        for failed in write_limits(self.root, folder, CONTROLLERS):  # (files it has)
            log.warning("job limits: cannot cap %s: %s", self.root, failed)
        return enabled

    def path(self, run_dir: Path, part: str) -> Path:
        return self.root / f"{group_key(run_dir)}.{part}"

    def make(self, run_dir: Path, part: str, limits: Mapping[str, str] | None = None) -> Path:
        """The part's cgroup, made when missing, with `limits` (file -> value) written
        for the controllers it has: its `cgroup.procs`, where a process that writes its
        own pid joins it. Raises OSError (naming the cgroup) when it cannot be made: a
        job never starts outside its cgroup where there are cgroups. A limit that cannot
        be written is logged, and the part runs without it."""
        group = self.path(run_dir, part)
        try:
            group.mkdir(exist_ok=True)
        except OSError as err:
            raise OSError(err.errno, f"cannot make the cgroup {group}: {err.strerror}") from err
        for failed in write_limits(group, limits or {}, self.controllers):
            log.warning("job limits: cannot limit %s: %s", group, failed)
        return group / "cgroup.procs"

    def part_end(self, run_dir: Path, part: str) -> PartEnd:
        """What the kernel did to the part (OOM kills, refused forks) and its limits:
        read before `kill` removes it."""
        return read_end(self.path(run_dir, part))

    def enter(self, run_dir: Path, part: str) -> Entry:
        """A `preexec_fn` that puts the child into the part's cgroup (made here, before
        the fork: the child only writes to a file already open), or fails the child's
        start (Popen raises) when it cannot. Raises OSError when the cgroup cannot be
        made. `close()` it after the fork. A `preexec_fn` makes Python fork rather than
        vfork: 25 ms for a 400 MB parent (measured), so a process already forked that way
        (a Ray actor's) uses it, and a shell wrapper joins by itself instead (`make`, then
        `echo $$ > procs`)."""
        procs = self.make(run_dir, part)
        try:
            return Entry(os.open(procs, os.O_WRONLY | os.O_CLOEXEC))
        except OSError as err:
            raise OSError(err.errno, f"cannot open {procs}: {err.strerror}") from err

    def holding(self) -> Path | None:
        """A new cgroup for a process started before its job is known (a warm launcher,
        from birth: whatever it or anything that reaches it starts stays there), named
        after this process so a later start can tell a dead server's: its
        `cgroup.procs` (None: it cannot be made)."""
        group = self.root / f"{HOLDING}{os.getpid()}-{next(_HELD)}"
        try:
            group.mkdir()
        except OSError:
            return None
        return group / "cgroup.procs"

    def adopt(self, run_dir: Path, part: str, holding: Path) -> bool:
        """Move every member of the `holding` cgroup (its `cgroup.procs`) into the part's,
        then remove it. A member may fork while it moves (the child lands in `holding`):
        its members are read again until none is left. False: some could not be moved."""
        try:
            target = self.make(run_dir, part)
            for _ in range(MOVE_ROUNDS):
                members = _members(holding.parent)
                if not members:
                    break
                for pid in members:
                    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                        target.write_text(str(pid))
        except OSError:
            return False
        if _members(holding.parent):
            return False
        _remove(holding.parent)
        return True

    def kill_stale(self) -> int:
        """Kill the holding cgroups of servers that are gone (their waiting processes,
        and anything those started); returns how many processes were there."""
        hit = 0
        for group in self.root.glob(f"{HOLDING}*"):
            owner = group.name.removeprefix(HOLDING).split("-", 1)[0]
            if owner.isdigit() and not pid_alive(int(owner)):
                hit += kill_group(group)
        return hit

    def sweep(self, older_than_s: float = SWEEP_AFTER_S) -> int:
        """Remove the empty cgroups left behind (a Ray actor killed before it saw its
        launcher end, a server killed mid-attempt); ones made within `older_than_s` are
        left for the process about to enter them. Returns how many went."""
        gone, cutoff = 0, time.time() - older_than_s
        for group in self.root.iterdir():
            try:
                if not group.is_dir() or group.stat().st_ctime > cutoff:
                    continue
                group.rmdir()  # the kernel refuses a cgroup that has members
            except OSError:
                continue
            gone += 1
        return gone

    def kill(self, run_dir: Path, part: str | None = None, wait_s: float = KILL_WAIT_S) -> int:
        """SIGKILL every process in the run directory's cgroups (with `part`: that part's
        alone), then remove them, waiting at most `wait_s` for each to empty (one that
        does not, a member stuck in the kernel, is left for `sweep`); returns how many
        processes were there."""
        if part is not None:
            return kill_group(self.path(run_dir, part), wait_s)
        return sum(kill_group(g, wait_s) for g in self.root.glob(f"{group_key(run_dir)}.*"))


class Entry:
    """The child's step into a cgroup: writes 0 (the writing process itself) to the
    cgroup's open `cgroup.procs`. A child that cannot join raises, so its start fails
    (`Popen` raises SubprocessError) rather than run outside the cgroup."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self) -> None:
        os.write(self.fd, b"0")

    def close(self) -> None:
        """The parent's copy of the file, once the child is forked."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


def both(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    """One `preexec_fn` that runs each given step in order (None: nothing to run)."""
    chosen = [s for s in steps if s is not None]
    if not chosen:
        return None

    def run() -> None:
        for step in chosen:
            step()

    return run


def join_cgroup(or_else: str) -> str:
    """A wrapper's first step: it joins the cgroup whose `cgroup.procs` is `$1` (none:
    "") before it starts anything, then drops the argument. Where it cannot, it runs
    `or_else` and ends, having started nothing."""
    return (
        f'if [ -n "$1" ] && ! echo $$ 2>/dev/null > "$1"; then\n  {or_else}\n  exit 1\nfi\nshift\n'
    )


def kill_group(group: Path, wait_s: float = KILL_WAIT_S) -> int:
    """SIGKILL every member of `group` and remove it once empty; how many there were."""
    members = _members(group)
    if not members:
        _remove(group)
        return 0
    try:
        (group / "cgroup.kill").write_text("1")  # the kernel kills every member, forks too
        by_kernel = True
    except OSError:
        by_kernel = False  # before Linux 5.14: frozen, each member killed (read again)
    deadline = time.monotonic() + wait_s
    for rounds in itertools.count():
        if not by_kernel:  # (pids read while frozen: none of them can be reused yet)
            _freeze(group, True)
            for pid in _members(group):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            _freeze(group, False)
        if not _members(group) or time.monotonic() >= deadline:
            break
        time.sleep(_pause(rounds))
    _remove(group, deadline)
    return len(members)


def _joinable(root: Path) -> bool:
    """Whether a child process can join a new cgroup under `root` (mkdir alone may work
    where a move does not: a read-only `cgroup.procs`, a threaded subtree)."""
    probe = root / f"probe-{os.getpid()}-{next(_HELD)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        join = 'echo $$ > "$0"'  # the shell writes its own pid, as a job's wrapper does
        done = subprocess.run(["sh", "-c", join, str(probe / "cgroup.procs")], timeout=30)
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        kill_group(probe)


def _members(group: Path) -> list[int]:
    try:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _freeze(group: Path, frozen: bool) -> None:
    with contextlib.suppress(OSError):
        (group / "cgroup.freeze").write_text("1" if frozen else "0")


def _remove(group: Path, deadline: float = 0.0) -> None:
    """Remove `group`; until `deadline` (monotonic) again while the kernel says busy: a
    killed member is gone from `cgroup.procs` a moment before it stops counting."""
    for rounds in itertools.count():
        try:
            group.rmdir()
        except OSError as err:
            if err.errno == errno.EBUSY and time.monotonic() < deadline:
                time.sleep(_pause(rounds))
                continue
        return


def _pause(rounds: int) -> float:
    """The wait before a kill's next look: 1 ms, doubling to 10 ms (members die in a
    millisecond or two; a look costs a read of one small file)."""
    return min(0.01, 0.001 * 2**rounds)
