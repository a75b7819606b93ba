"""How much of this machine one attempt may use: its cgroup limits and its rlimits.

A job holds devices on a node; its share of the machine is its devices over the node's
(all the local executor's nodes are this machine). An attempt's part of the host is
that share of what is left once `headroom_fraction` is kept for the control plane and
the host: memory (`memory.max`, no swap), CPU (`cpu.weight`: a weight, not a cap, so an
attempt uses idle CPUs freely and gets its share under contention) and tasks
(`pids.max`: processes and threads). Floors let a tiny share still start Python and torch; the
kernel holds the sum of every attempt to what is left through the same limits on the
`argosy-jobs` folder (`folder_limits`, with a hard `cpu.max`), so neither floors nor idle
CPUs lent to a busy job ever reach the control plane's part.

    host = HostSize.here()
    part = part_limits(share_of(1, 8), host, JobLimitsConfig())   # one device of eight
    part.files()     # {"pids.max": "...", "memory.max": "...", "cpu.weight": "1250", ...}
    argv = with_rlimits(argv, job_rlimits(JobLimitsConfig()))      # prlimit ... -- argv

The rlimits (`job_rlimits`) are one set for every start of a job user's process, cold
or warm: RLIMIT_NPROC (that uid's tasks on the host), RLIMIT_NOFILE and RLIMIT_FSIZE
(the largest file a job may write; checkpoints included), set before the user switch.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from argosy.executors.base import AttemptExit

GIB = 1 << 30
_N = TypeVar("_N", int, float)
CPU_PERIOD_US = 100_000
"""The `cpu.max` period: an attempt may run `cpus` x this many microseconds in each."""
MIN_CPUS = 1.0
"""An attempt's CPU floor (capped at what the host has left)."""
MIN_MEMORY_BYTES = 64 << 20
"""An attempt's memory floor whatever `min_memory_gib` says: below it nothing starts."""
MIN_TASKS = 4096
"""An attempt's `pids.max` floor: a few ranks of torch, each with its thread pools."""
JOB_MAX_PROCESSES = 32768
"""RLIMIT_NPROC of a job's user (processes and threads of that uid, all its jobs on the
host together): a fork bomb stops there, not at the host's limit."""
JOB_MAX_OPEN_FILES = 65536
"""RLIMIT_NOFILE (soft and hard) of a job's processes."""


class JobLimitsConfig(BaseModel):
    """What one attempt of a job may use of its machine (local executor)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    enabled: bool = True
    """Limit each attempt's memory and tasks to its devices' share of the machine, and
    weigh its CPU by that share (cgroup v2 `memory.max`, `pids.max`, `cpu.weight`; the
    jobs together capped by `cpu.max`) where the server may enable
    those controllers; off: attempts are grouped and killed, not limited."""
    headroom_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Part of the machine's memory, CPUs and tasks kept for the control plane and the
    host: jobs together never get more than the rest."""
    min_memory_gib: float = Field(default=4.0, ge=0.0)
    """Memory an attempt gets at least, however small its share (Python and torch must
    start), capped at what jobs may have together."""
    max_file_size_gib: float = Field(default=1024.0, ge=0.0)
    """RLIMIT_FSIZE of a job user's processes: the largest file a job may write (a
    checkpoint shard, a /dev/shm snapshot slot); 0: no limit."""
    private_shm: bool = True
    """Start a job user's attempts in mount and IPC namespaces of their own, with a fresh
    /dev/shm: what an attempt leaves there or in SysV IPC is charged to its own memory
    limit and freed when it ends (`argosy.executors.private_shm`; needs a root server)."""
    remove_leftovers: bool = True
    """Once a job user the server created has had no attempt on this machine for a minute,
    remove what it left in /dev/shm and /tmp (its top-level entries) and its SysV IPC
    objects, by a process of that user (`argosy.executors.leftovers`)."""


@dataclass(frozen=True)
class HostSize:
    """What this machine gives this server: memory, CPUs and tasks (processes and
    threads), the least of the hardware's and of the limits of every cgroup above the
    server (a container's, a systemd unit's `MemoryMax=`): the jobs' folder and their
    shares are sized from what is really there."""

    memory_bytes: int
    cpus: float
    tasks: int

    @classmethod
    def here(cls) -> HostSize:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        tasks = min(_proc_int("pid_max", 32768), _proc_int("threads-max", 32768))
        host = cls(memory, float(cpus or os.cpu_count() or 1), tasks)
        return host.within(_own_cgroups())

    def within(self, groups: list[Path]) -> HostSize:
        """This size, less where a cgroup of `groups` allows less (`memory.max`,
        `cpu.max`, `pids.max`; "max" or a missing file: no limit)."""
        memory, cpus, tasks = self.memory_bytes, self.cpus, self.tasks
        for group in groups:
            memory = min(memory, cgroup_int(group / "memory.max") or memory)
            tasks = min(tasks, cgroup_int(group / "pids.max") or tasks)
            cpus = min(cpus, _cgroup_cpus(group / "cpu.max") or cpus)
        return HostSize(memory, cpus, tasks)


def _own_cgroups() -> list[Path]:
    """This process's cgroup (v2) and every one above it, up to the mount's root."""
    from argosy.executors.cgroups import own_cgroup_path  # (it imports this module)

    found = own_cgroup_path()
    if found is None:
        return []
    mount, own = found
    here = mount / own.lstrip("/")
    return [here, *[p for p in here.parents if p.is_relative_to(mount) and p != mount]]


def cgroup_int(path: Path) -> int | None:
    """A cgroup file's one number (`memory.max`); None when it says "max" or is missing."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_cpus(path: Path) -> float | None:
    """CPUs a `cpu.max` ("quota period", or "max period") allows; None: no limit."""
    try:
        quota, period = path.read_text().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def _proc_int(name: str, default: int) -> int:
    try:
        return int(Path(f"/proc/sys/kernel/{name}").read_text())
    except (OSError, ValueError):
        return default


@dataclass(frozen=True)
class PartLimits:
    """One cgroup's limits: memory in bytes (no swap), CPUs (fractional) and tasks. With
    a `cpu_weight` (an attempt's), its CPUs are a weight, not a cap: an attempt uses idle
    CPUs freely and gets its share under contention; the folder of all jobs is capped."""

    memory_bytes: int
    cpus: float
    tasks: int
    cpu_weight: int | None = None

    def files(self) -> dict[str, str]:
        """The cgroup files and the values that set these limits."""
        out = {
            "pids.max": str(self.tasks),
            "memory.max": str(self.memory_bytes),
            "memory.swap.max": "0",  # over its memory a job is killed, not swapped
        }
        if self.cpu_weight is not None:
            out["cpu.weight"] = str(self.cpu_weight)
        else:
            out["cpu.max"] = f"{max(1000, math.floor(self.cpus * CPU_PERIOD_US))} {CPU_PERIOD_US}"
        return out


MAX_CPU_WEIGHT = 10_000
"""cgroup v2's largest `cpu.weight` (the default is 100): an attempt's is its CPUs'
share of the jobs' folder times this."""
UNLIMITED = {"pids.max": "max", "memory.max": "max", "memory.swap.max": "max", "cpu.max": "max"}
"""The limit files' values that lift every limit (`job_limits.enabled: false`)."""


def share_of(devices: int, host_devices: int) -> float:
    """An attempt's share of its machine: its devices there over the machine's, in [0, 1]."""
    if host_devices <= 0:
        return 1.0
    return min(1.0, max(0.0, devices / host_devices))


def folder_limits(host: HostSize, config: JobLimitsConfig) -> PartLimits:
    """What every job on this machine together may use: the host less the headroom."""
    keep = 1.0 - config.headroom_fraction
    return PartLimits(
        memory_bytes=max(1, math.floor(host.memory_bytes * keep)),
        cpus=max(0.01, host.cpus * keep),
        tasks=max(1, math.floor(host.tasks * keep)),
    )


def part_limits(share: float, host: HostSize, config: JobLimitsConfig) -> PartLimits:
    """An attempt's limits: `share` of what jobs may use together, at least the floors
    (`min_memory_gib` and MIN_MEMORY_BYTES, MIN_CPUS, MIN_TASKS), at most all of it."""
    whole = folder_limits(host, config)
    floor_bytes = max(MIN_MEMORY_BYTES, math.floor(config.min_memory_gib * GIB))
    memory = math.floor(share * whole.memory_bytes)
    cpus = _clamp(share * whole.cpus, MIN_CPUS, whole.cpus)
    return PartLimits(
        memory_bytes=_clamp(memory, floor_bytes, whole.memory_bytes),
        cpus=cpus,
        tasks=_clamp(math.floor(share * whole.tasks), MIN_TASKS, whole.tasks),
        cpu_weight=_clamp(round(cpus / whole.cpus * MAX_CPU_WEIGHT), 1, MAX_CPU_WEIGHT),
    )


def _clamp(value: _N, floor: _N, ceiling: _N) -> _N:
    return min(max(value, min(floor, ceiling)), ceiling)


@dataclass(frozen=True)
class Rlimits:
    """A job user's process limits (soft and hard alike); `fsize` None: no limit."""

    nproc: int
    nofile: int
    fsize: int | None

    def prlimit_args(self) -> list[str]:
        fsize = "unlimited" if self.fsize is None else str(self.fsize)
        return [f"--nproc={self.nproc}", f"--nofile={self.nofile}", f"--fsize={fsize}"]


Hard = Callable[[int], tuple[int, int]]


def job_rlimits(config: JobLimitsConfig, getrlimit: Hard = resource.getrlimit) -> Rlimits:
    """The rlimits of a job user's processes, each within this process's hard limit (an
    unprivileged `prlimit` could not raise it; root's are the host's)."""
    fsize = math.floor(config.max_file_size_gib * GIB) or None
    return Rlimits(
        nproc=_within_hard(resource.RLIMIT_NPROC, JOB_MAX_PROCESSES, getrlimit),
        nofile=_within_hard(resource.RLIMIT_NOFILE, JOB_MAX_OPEN_FILES, getrlimit),
        fsize=None if fsize is None else _within_hard(resource.RLIMIT_FSIZE, fsize, getrlimit),
    )


def _within_hard(which: int, wanted: int, getrlimit: Hard) -> int:
    """`wanted`, or this process's hard limit where that is lower."""
    _, hard = getrlimit(which)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def with_rlimits(argv: list[str], rlimits: Rlimits) -> list[str]:
    """`argv` run under `prlimit` with `rlimits` (set before whatever `argv` does, a user
    switch included; the job cannot raise them without privileges); unchanged where
    `prlimit` (util-linux) is not installed."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return argv
    return [prlimit, *rlimits.prlimit_args(), "--", *argv]


def lower_own_rlimits(rlimits: Rlimits) -> None:
    """Lower this process's rlimits to `rlimits` (never raising one), so what it forks
    starts under them: the node zygote's serving workers."""
    wanted = {
        resource.RLIMIT_NPROC: rlimits.nproc,
        resource.RLIMIT_NOFILE: rlimits.nofile,
        resource.RLIMIT_FSIZE: rlimits.fsize,
    }
    for which, value in wanted.items():
        if value is None:
            continue
        soft, hard = resource.getrlimit(which)
        new_hard = value if hard == resource.RLIM_INFINITY else min(value, hard)
        new_soft = new_hard if soft == resource.RLIM_INFINITY else min(soft, new_hard)
        resource.setrlimit(which, (new_soft, new_hard))


@dataclass(frozen=True)
class PartEnd:
    """What the kernel did to an attempt's cgroup (`cgroup_controllers.read_end`)."""

    oom: int = 0
    """Times its memory reached `memory.max` with nothing left to reclaim."""
    oom_kill: int = 0
    """Its processes the kernel's OOM killer ended (its own limit's or the host's)."""
    pids_max_hits: int = 0
    """Forks and clones refused at `pids.max`."""
    memory_max: int | None = None
    pids_max: int | None = None


def explain_exit(e: AttemptExit, end: PartEnd) -> AttemptExit:
    """`e` told as the limits ended it: over its memory limit, the attempt failed (the
    job's doing, not lost: a new attempt would do the same); short of tasks, or of the
    host's memory, the reason says so. A success stays as it is. (A file over
    RLIMIT_FSIZE is not told from the exit: Python ignores SIGXFSZ, so the write fails
    with EFBIG in the job's own traceback, and an exit 153 is the job's own.)"""
    if e.exit_code == 0:
        return e
    if end.oom_kill and end.oom and end.memory_max is not None:
        why = (
            f"killed: over its memory limit of {_size(end.memory_max)} (the kernel ended"
            f" {end.oom_kill} of its processes; {e.reason})"
        )
        return replace(e, lost=False, reason=why)
    why = e.reason
    if end.oom_kill:
        why += f"; the host ran short of memory, and the kernel ended {end.oom_kill} of its"
        why += " processes"
    if end.pids_max_hits and end.pids_max is not None:
        why += (
            f"; it reached its limit of {end.pids_max} processes and threads"
            f" ({end.pids_max_hits} forks refused)"
        )
    return replace(e, reason=why)


def _size(num_bytes: int) -> str:
    """A limit in words: GiB with one decimal, MiB below one GiB."""
    if num_bytes >= GIB:
        return f"{num_bytes / GIB:.1f} GiB"
    return f"{num_bytes / (1 << 20):.0f} MiB"
