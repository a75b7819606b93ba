"""The controllers of the job cgroups: `pids`, `memory` and `cpu` enabled down to each
attempt's cgroup, its limits written, and what the kernel did to it read at its end.

cgroup v2 hands a controller down one level at a time: a cgroup's children have it once
`+<controller>` is in the cgroup's `cgroup.subtree_control`, which the kernel refuses
(EBUSY) for a cgroup other than the root that holds processes itself ("no internal
processes"). `argosy-jobs/` holds none (only the attempts' and holding cgroups), but it
lies in the server's own cgroup, which holds the server. So, for each controller:

1. its parent must have it (`cgroup.controllers`): under systemd, `Delegate=yes`;
2. the server's cgroup enables it; where the kernel says busy and the server is the only
   process there, the server moves into a leaf of its own, `argosy-server/`, and tries
   again; not out of a systemd unit's cgroup, where systemd would start it again next
   time, which the kernel then refuses: there `DelegateSubgroup=argosy-server` (systemd
   254+) starts the server in that leaf;
3. `argosy-jobs/` enables it.

A controller that cannot be had is left out, never failing a start (`Enabled.missing`
says why, for one line in the log); its limits are then not written.

    enabled = enable_controllers(Path("/sys/fs/cgroup/system.slice/argosy.service/argosy-jobs"))
    failed = write_limits(group, {"pids.max": "4096", ...}, enabled.controllers)
    end = read_end(group)          # PartEnd(oom=1, oom_kill=1, ...) before the group goes
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from argosy.executors.limits import PartEnd, cgroup_int

CONTROLLERS = ("pids", "memory", "cpu")
SERVER_LEAF = "argosy-server"
"""The leaf cgroup the server moves into so its own cgroup may hand controllers down."""
SYSTEMD_UNITS = (".service", ".scope")
"""A cgroup of these names is a systemd unit's: systemd attaches the server's next start
to it, which the kernel refuses (EBUSY) once it hands controllers down, so the server
does not move out of it; `DelegateSubgroup=argosy-server` starts it in the leaf."""


@dataclass(frozen=True)
class Enabled:
    """The controllers the attempts' cgroups have, and why the others are missing."""

    controllers: frozenset[str]
    missing: dict[str, str] = field(default_factory=dict)

    def note(self) -> str | None:
        """One line for the log when a controller is missing (None: all are there)."""
        if not self.missing:
            return None
        names = ", ".join(sorted(self.missing))
        reasons: dict[str, list[str]] = {}
        for controller, reason in sorted(self.missing.items()):
            reasons.setdefault(reason, []).append(controller)
        why = "; ".join(f"{', '.join(cs)}: {reason}" for reason, cs in reasons.items())
        return f"job limits: attempts run without the {names} limits ({why})"


Write = Callable[[Path, str], None]


def enable_controllers(
    folder: Path,
    wanted: Iterable[str] = CONTROLLERS,
    pid: int | None = None,
    write: Write | None = None,
) -> Enabled:
    """Enable `wanted` in `folder` (`argosy-jobs/`) and in its parent (the server's
    cgroup, which this process, `pid`, leaves for `SERVER_LEAF` where it alone holds it).
    `write` writes one cgroup file (default: the kernel's; a test's stand-in)."""
    wanted, write = tuple(wanted), write or _write
    pid = os.getpid() if pid is None else pid
    missing: dict[str, str] = {}
    for controller in wanted:
        if controller not in _words(folder / "cgroup.controllers"):
            why = _enable_in(folder.parent, controller, pid, write)
            if why is not None:
                missing[controller] = why
    for controller in wanted:
        if controller in missing:
            continue
        try:
            write(folder / "cgroup.subtree_control", f"+{controller}")
        except OSError as err:
            missing[controller] = f"{folder}: {err.strerror}"
    enabled = frozenset(_words(folder / "cgroup.subtree_control")) & set(wanted)
    for controller in set(wanted) - enabled:
        missing.setdefault(controller, f"{folder} does not list it as enabled")
    return Enabled(enabled, missing)


def _enable_in(base: Path, controller: str, pid: int, write: Write) -> str | None:
    """Enable `controller` in `base`'s subtree; None when done, else why not."""
    if controller not in _words(base / "cgroup.controllers"):
        if not (base.parent / "cgroup.procs").exists():  # the hierarchy's root
            return f"the cgroup v2 root {base} lacks it (bound to cgroup v1 on a hybrid host)"
        return f"{base} is not given it by its parent (systemd: Delegate=yes)"
    for moved in (False, True):
        try:
            write(base / "cgroup.subtree_control", f"+{controller}")
            return None
        except OSError as err:
            if err.errno != errno.EBUSY or moved:
                return f"{base}: {err.strerror}"
        others = [m for m in _members(base) if m != pid]
        if others:
            return (
                f"{base} holds processes besides this server ({len(others)}), and a cgroup"
                " with processes cannot hand controllers down (run the server in a cgroup of"
                f" its own, or systemd's DelegateSubgroup={SERVER_LEAF})"
            )
        if base.name.endswith(SYSTEMD_UNITS):  # its next start would be refused there
            return (
                f"{base} holds this server, and systemd starts it there again, which a cgroup"
                f" handing controllers down refuses: add DelegateSubgroup={SERVER_LEAF} to"
                " the unit (systemd 254+)"
            )
        try:
            (base / SERVER_LEAF).mkdir(exist_ok=True)
            write(base / SERVER_LEAF / "cgroup.procs", str(pid))
        except OSError as err:
            return f"cannot move this server into {base / SERVER_LEAF}: {err.strerror}"
    return None


def write_limits(group: Path, limits: Mapping[str, str], enabled: Iterable[str]) -> list[str]:
    """Write `limits` (file name -> value) into `group`, those of `enabled` controllers
    only; a file the kernel does not offer (`memory.swap.max` without swap accounting) is
    skipped. Returns what could not be written, each with its reason."""
    allowed = set(enabled)
    failed = []
    for name, value in limits.items():
        path = group / name
        if name.split(".", 1)[0] not in allowed or not path.exists():
            continue
        try:
            _write(path, value)
        except OSError as err:
            failed.append(f"{name}={value}: {err.strerror}")
    return failed


def read_end(group: Path) -> PartEnd:
    """What the kernel did to `group`: OOM events and kills (`memory.events`), forks
    refused (`pids.events`), and the limits it had; zeros where a file is missing."""
    memory = _counters(group / "memory.events")
    return PartEnd(
        oom=memory.get("oom", 0),
        oom_kill=memory.get("oom_kill", 0),
        pids_max_hits=_counters(group / "pids.events").get("max", 0),
        memory_max=cgroup_int(group / "memory.max"),
        pids_max=cgroup_int(group / "pids.max"),
    )


def parse_counters(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file (`memory.events`: "oom 1\\noom_kill 1\\n") as a dict."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return found


def _counters(path: Path) -> dict[str, int]:
    try:
        return parse_counters(path.read_text())
    except OSError:
        return {}


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _members(group: Path) -> list[int]:
    try:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _write(path: Path, value: str) -> None:
    """One write of `value` (a cgroup file takes one value per write)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
