"""Named crash points in the save / persist / commit path, armed only by tests and soaks.

    ARGOSY_CKPT_CRASH="commit:2"        # SIGKILL this process the 2nd time it reaches "commit"
    ARGOSY_CKPT_CRASH="copy:5:stall"    # stop there for good (a wedged persister)

Points: "copy" (mid-copy into a slot), "write" (mid-shard write), "publish" (shard durable,
done-marker not yet written), "commit" (manifest written, rename not yet done), "renamed"
(committed, older steps not yet pruned). Unarmed (the variable unset), `reach` costs one
dict lookup.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "ARGOSY_CKPT_CRASH"
POINTS = ("copy", "write", "publish", "commit", "renamed")

_armed: dict[str, tuple[int, str]] = {}
_seen: dict[str, int] = {}


def _arm() -> None:
    spec = os.environ.get(ENV, "")
    if spec:
        point, count, action = (spec.split(":") + ["1", "kill"])[:3]
        _armed[point] = (int(count or 1), action)


_arm()


def reach(point: str) -> None:
    """Count a visit of `point`; SIGKILL this process (or stall it) at the armed visit."""
    if point not in _armed:
        return
    _seen[point] = _seen.get(point, 0) + 1
    count, action = _armed[point]
    if _seen[point] != count:
        return
    if action == "stall":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)
