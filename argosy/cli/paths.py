"""Output paths given on the command line, checked before any work starts.

A path that cannot be written (`--out`, `--plot`, `--run-dir`, ...) is a usage error:
one line naming the option, the path and why, exit 2, never a traceback after minutes of
work. The check really creates the directory and a probe file, so permissions, read-only
mounts, a file where a directory is wanted and a full disk are all caught.

    run_dir = writable_dir(Path("runs/demo"), "--run-dir")
    png = writable_file(Path("out/plot.png"), "--plot")
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from argosy.core.errors import ArgosyError


def writable_dir(path: Path, option: str) -> Path:
    """Create `path` (and parents) if needed and prove a file can be written in it."""
    try:
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"'{path}' exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".argosy-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ArgosyError(f"{option} {path}: cannot write there ({_why(err)})") from None
    return path


def writable_file(path: Path, option: str) -> Path:
    """Prove `path` can be written: it is not a directory and its nearest existing
    directory takes a new file. Nothing is created on the way."""
    if path.is_dir():
        raise ArgosyError(f"{option} {path}: is a directory; give a file name")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if parent == path.absolute().parent:
        writable_dir(parent, option)
    elif not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ArgosyError(f"{option} {path}: cannot write there ({parent} is not writable)")
    if path.exists() and not os.access(path, os.W_OK):
        raise ArgosyError(f"{option} {path}: cannot write there (permission denied)")
    return path


def _why(err: OSError) -> str:
    return err.strerror or str(err)
