"""Named crash points in the save / persist / commit path, armed only by tests and soaks.

    ARGOSY_CKPT_CRASH="commit:2"        # SIGKILL this process the 2nd time it reaches "commit"
    ARGOSY_CKPT_CRASH="copy:5:stall"    # stop there for good (a wedged persister)
    ARGOSY_CKPT_CRASH="write:1:enospc"  # raise OSError(ENOSPC) there (a full disk)
    ARGOSY_CKPT_FAULTS=/path/to/file    # the same spec, read from a file whenever it changes
    faultpoints.arm("metadata:1:crash")  # in-process tests: raise Crash there

Points, in the order a step passes them: "copy" (mid-copy into a slot), "write" (mid-shard
write), "publish" (shard and index durable, done-marker not yet written), "metadata"
(`.metadata` and manifest written, not yet synced), "commit" (all synced, rename not yet
done), "renamed" (committed, older steps not yet pruned). Actions: "kill" (default),
"stall", "enospc", "crash" (raise `Crash`, a BaseException: it unwinds past every
`except Exception`, leaving the files as a SIGKILL there would, in the same process).

The file form arms a live process (a soak's persister) without restarting it: each time
its content changes, the spec in it is armed afresh and its count starts from zero; an
empty file disarms. Unarmed (both variables unset), `reach` costs one dict lookup; with a
file, one `stat` per visit.
"""

from __future__ import annotations

import errno
import os
import signal
import time

ENV = "ARGOSY_CKPT_CRASH"
FILE_ENV = "ARGOSY_CKPT_FAULTS"
POINTS = ("copy", "write", "publish", "metadata", "commit", "renamed")
ACTIONS = ("kill", "stall", "enospc", "crash")


class Crash(BaseException):
    """An in-process stand-in for SIGKILL at a crash point (action "crash"); `args[0]` is
    the point."""


_armed: dict[str, tuple[int, str]] = {}
_seen: dict[str, int] = {}
_file = ""
_file_stamp: tuple[int, int] | None = None


def parse(spec: str) -> tuple[str, int, str]:
    """(point, count, action) of "point[:count[:action]]"; ValueError naming what is wrong."""
    parts = spec.strip().split(":")
    point = parts[0]
    count = parts[1] if len(parts) > 1 and parts[1] else "1"
    action = parts[2] if len(parts) > 2 else "kill"
    if point not in POINTS or action not in ACTIONS:
        raise ValueError(f"fault spec {spec!r}: points are {POINTS}, actions {ACTIONS}")
    return point, int(count), action


def _arm(spec: str) -> None:
    _armed.clear()
    _seen.clear()
    if spec.strip():
        point, count, action = parse(spec)
        _armed[point] = (count, action)


def from_environment() -> None:
    """Arm this process as its environment says (at import; again by a persister started
    ahead, once it took its trainer's environment)."""
    global _file, _file_stamp
    _file, _file_stamp = os.environ.get(FILE_ENV, ""), None
    _arm(os.environ.get(ENV, ""))


from_environment()


def arm(spec: str) -> None:
    """Arm this process at "point[:count[:action]]" (an empty spec disarms)."""
    _arm(spec)


def _reload() -> None:
    """Re-arm from the fault file when it changed since the last look."""
    global _file_stamp
    try:
        st = os.stat(_file)
    except OSError:
        return
    stamp = (st.st_mtime_ns, st.st_size)
    if stamp == _file_stamp:
        return
    _file_stamp = stamp
    try:
        with open(_file) as f:
            _arm(f.read())
    except (OSError, ValueError):
        _arm("")


def reach(point: str) -> None:
    """Count a visit of `point`; act (kill, stall, ENOSPC) at the armed visit."""
    if _file:
        _reload()
    if point not in _armed:
        return
    _seen[point] = _seen.get(point, 0) + 1
    count, action = _armed[point]
    if _seen[point] != count:
        return
    if action == "stall":
        while True:
            time.sleep(3600)
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {point})")
    if action == "crash":
        raise Crash(point, count)
    os.kill(os.getpid(), signal.SIGKILL)
