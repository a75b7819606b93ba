"""Reading files that a job wrote, from a process that may be more privileged than the job.

A job owns the files in its run directory, so it decides what each name there points at:
a symlink to `/root/.argosy/admin.token`, a hard link to the server's database, a FIFO
that blocks whoever opens it, a file of a terabyte. The server (often root) reads such
files to show logs, summaries and live figures. Every such read goes through here:

- the path is walked from `root` one component at a time with `O_NOFOLLOW` (a symlink
  anywhere below `root` is refused, and a directory swapped mid-walk cannot redirect
  the walk: each step opens relative to the descriptor of the one before);
- the file must be a regular file with one link (a hard link to a file elsewhere has
  two or more), opened with `O_NONBLOCK` (a FIFO never blocks the reader);
- at most `limit` bytes are read.

`root` itself is trusted: it is a directory the server created. `read_job_file` finds
that root itself: the deepest directory on the way that this process (or root) owns, so
every directory below it, which someone else owns, is walked without following links.

    data = read_confined(run_dir, "summary.json", limit=1 << 20)   # bytes, or None
    names = list_confined(run_dir, "logs")                          # [] when absent
    data = read_job_file(run_dir / "logs" / "attempt1" / "rank0.log", limit=1 << 20)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # a trusted root may be a link
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafePathError(ValueError):
    """A relative path that climbs out of its root, or is absolute."""


def _parts(rel: str | Path) -> list[str]:
    parts = [p for p in PurePosixPath(rel).parts if p not in ("", ".")]
    if PurePosixPath(rel).is_absolute() or ".." in parts:
        raise UnsafePathError(f"'{rel}' is not a path inside its directory")
    return parts


def _open_dir(root: Path, parts: list[str]) -> int:
    """A descriptor of `root/parts...`, every component a real directory (OSError else)."""
    fd = os.open(root, ROOT_FLAGS)
    try:
        for part in parts:
            nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_confined(root: Path, rel: str | Path) -> int | None:
    """A read descriptor of the regular, singly linked file `root/rel`, or None when it is
    absent or is anything else (a symlink on the way, a FIFO, a hard link, a directory)."""
    parts = _parts(rel)
    if not parts:
        return None
    try:
        dir_fd = _open_dir(root, parts[:-1])
    except OSError:
        return None
    try:
        fd = os.open(parts[-1], FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        return None
    return fd


def read_confined(root: Path, rel: str | Path, *, limit: int, offset: int = 0) -> bytes | None:
    """At most `limit` bytes of `root/rel` from `offset`; None when it is not a file that
    `open_confined` accepts."""
    fd = open_confined(root, rel)
    if fd is None:
        return None
    try:
        return os.pread(fd, limit, offset) if limit > 0 else b""
    finally:
        os.close(fd)


def trusted_root(path: Path) -> Path:
    """The deepest ancestor directory of `path` that it and every directory above it are
    owned by root or by this process's user: nobody else can have put a link there."""
    path = Path(os.path.abspath(path))
    trusted = Path(path.anchor)
    me = os.geteuid()
    for ancestor in [*reversed(path.parents)][1:]:
        try:
            owner = os.lstat(ancestor).st_uid
        except OSError:
            break
        if owner not in (0, me):
            break
        trusted = ancestor
    return trusted


def read_job_file(path: Path, *, limit: int, offset: int = 0) -> bytes | None:
    """`read_confined` below `trusted_root(path)`: a file anywhere in a job's run
    directory, read without following anything the job could have planted."""
    path = Path(os.path.abspath(path))
    root = trusted_root(path)
    return read_confined(root, path.relative_to(root), limit=limit, offset=offset)


def read_job_text(path: Path, *, limit: int) -> str | None:
    """`read_job_file` as text (undecodable bytes replaced); None when it reads nothing."""
    data = read_job_file(path, limit=limit)
    return None if data is None else data.decode(errors="replace")


def stat_job_file(path: Path) -> os.stat_result | None:
    """`stat_confined` below `trusted_root(path)`."""
    path = Path(os.path.abspath(path))
    root = trusted_root(path)
    return stat_confined(root, path.relative_to(root))


def stat_confined(root: Path, rel: str | Path) -> os.stat_result | None:
    """The stat of `root/rel` as `open_confined` accepts it, or None."""
    fd = open_confined(root, rel)
    if fd is None:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def list_confined(root: Path, rel: str | Path = ".") -> list[str]:
    """Names in the directory `root/rel` (reached without following symlinks); [] when
    it is absent or not a directory."""
    try:
        fd = _open_dir(root, _parts(rel))
    except OSError:
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)
