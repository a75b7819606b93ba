"""Opening files in directories every user shares (/dev/shm, /tmp) safely.

Contract: `shared_memory_dir()` is /dev/shm where this user can write there, else the temp
directory. `own_directory(path)` makes `path` (mode 0700) or checks it is this user's
real directory, closing it to others if it was open; what holds the name otherwise.
`private_directory(path, what)` is `path` when `own_directory` takes it, else (another
user, a link or a file holds the name) a fresh private directory beside it, with a
warning: a guessable name in a shared directory can be squatted, and that must cost the
sharing of the name, never the service.
`open_own(path, flags)` returns a descriptor of `path` only when it is a regular
file owned by this effective user, opened without following a symlink at its last
component; otherwise `PermissionError` (another user's file, or not a regular file) or
`OSError` (ELOOP: a link). Names there are guessable (job and run ids are public), so
anything read back from such a file (a checkpoint slot's pickled metadata, a run's
progress board, the serving device ledger) could otherwise be another tenant's; and a
planted link would make a create-and-truncate write through to its target.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import warnings
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


def shared_memory_dir() -> Path:
    """/dev/shm when it exists and this user can write there, else the temp directory."""
    shm = Path("/dev/shm")
    return (
        shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp"))
    )


def own_directory(path: Path) -> os.stat_result | None:
    """Make `path` with mode 0700 (its parents too), or check that it is a directory of
    this user, not a link (one open to others is closed to 0700). None when it is; else
    what holds the name (a link, a file, another user's directory), from `lstat`."""
    with contextlib.suppress(FileExistsError):  # a file or a link there: told by lstat
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return st
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return None


def private_directory(path: Path, what: str) -> Path:
    """`path` when `own_directory` takes it (made 0700, or this user's own directory);
    else a fresh private directory beside it (`tempfile.mkdtemp`, 0700, named
    `<name>-<random>`), with a `UserWarning` saying what (`what`) goes there instead."""
    held = own_directory(path)
    if held is None:
        return path
    fresh = Path(tempfile.mkdtemp(prefix=f"{path.name}-", dir=path.parent))
    holder = "a link or a file" if not stat.S_ISDIR(held.st_mode) else f"uid {held.st_uid}"
    warnings.warn(
        f"{path} is held by {holder}, not this user ({os.geteuid()}): {what} go to {fresh}",
        stacklevel=2,
    )
    return fresh
