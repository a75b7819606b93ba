"""A run directory of a queue's former job user is handed to its current one, once.

Job users of queues whose names a user name cannot hold end in a hash of the queue:
8 hex digits up to `d3f3cf7`, 16 since (two queues could share an 8-digit user). A job
submitted before the change has its run directory (checkpoints, logs) owned by the old
user's group; its next attempt runs as the new user and could not read it. At that
attempt's start the directory's tree is handed over: every entry the old user owned
becomes the new one's, every entry of the old group the new group's. The job's queue
is the store's word, so each run directory goes to its own queue's user even where
two queues shared the old one.

The tree belongs to a tenant who may still run processes as the old user, so it is
walked by descriptor (`os.fwalk`: a directory swapped for a link is not entered) and
each entry re-owned by name in its directory without following a link: no path
outside the tree is ever changed.

    hand_over(run_dir, old=(uid, gid), new=(uid, gid))   # how many entries changed
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def hand_over(run_dir: Path, old: tuple[int, int], new: tuple[int, int]) -> int:
    """Re-own what `old` (uid, gid) owns under `run_dir` to `new`; the top directory's
    group too (it stays root's). Returns how many entries changed."""
    changed = 0
    for _, dirs, files, dir_fd in os.fwalk(run_dir, follow_symlinks=False):
        for name in (*dirs, *files):
            changed += _re_own(name, dir_fd, old, new)
    with contextlib.suppress(OSError):
        info = os.stat(run_dir, follow_symlinks=False)
        if info.st_gid == old[1]:
            os.chown(run_dir, -1, new[1], follow_symlinks=False)
            changed += 1
    return changed


def _re_own(name: str, dir_fd: int, old: tuple[int, int], new: tuple[int, int]) -> int:
    """One entry of an open directory re-owned (never through a link); 1 if it changed."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        uid = new[0] if info.st_uid == old[0] else -1
        gid = new[1] if info.st_gid == old[1] else -1
        if uid == gid == -1:
            return 0
        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:  # gone meanwhile
        return 0
    return 1
