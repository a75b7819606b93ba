"""Opening files in directories every user shares (/dev/shm, /tmp) safely.

Contract: `open_own(path, flags)` returns a descriptor of `path` only when it is a regular
file owned by this effective user, opened without following a symlink at its last
component; otherwise `PermissionError` (another user's file, or not a regular file) or
`OSError` (ELOOP: a link). Names there are guessable (job and run ids are public), so
anything read back from such a file (a checkpoint slot's pickled metadata, a run's
progress board, the serving device ledger) could otherwise be another tenant's; and a
planted link would make a create-and-truncate write through to its target.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def open_own(path: Path, flags: int, mode: int = 0o600) -> int:
    """A descriptor of `path`, a regular file of this user, never through a link."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(
            f"{path}: not a file of this user (owner uid {st.st_uid}, this user {os.geteuid()})"
        )
    return fd
