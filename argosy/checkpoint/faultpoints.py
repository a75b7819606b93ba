"""Named crash points in the save / persist / commit path, armed only by tests and soaks.

    ARGOSY_CKPT_CRASH="commit:2"    # SIGKILL this process the 2nd time it reaches "commit"

Points: "copy" (mid-copy into a slot), "write" (mid-shard write), "publish" (shard durable,
done-marker not yet written), "commit" (manifest written, rename not yet done), "renamed"
(committed, older steps not yet pruned). Unarmed (the variable unset), `reach` costs one
dict lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "ARGOSY_CKPT_CRASH"
POINTS = ("copy", "write", "publish", "commit", "renamed")

_armed: dict[str, int] = {}
_seen: dict[str, int] = {}


def _arm() -> None:
    spec = os.environ.get(ENV, "")
    if spec:
        point, _, count = spec.partition(":")
        _armed[point] = int(count or 1)


_arm()


def reach(point: str) -> None:
    """Count a visit of `point`; SIGKILL this process when it is the armed visit."""
    if point not in _armed:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] == _armed[point]:
        os.kill(os.getpid(), signal.SIGKILL)
