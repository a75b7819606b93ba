"""Job files parsed ahead, off the event loop: what taking in an attempt's exit reads.

Taking in an exit reads what the job left: its `summary.json` (up to 16 MiB of JSON) or,
when its launcher died first, its event log to summarize, up to about half a second of
parsing that would hold every request the server answers. So the control loop first
parses them in a worker thread (`read_ahead`), keyed by the file's identity (device,
inode, size, modification time, as the confined open sees it); the exit, taken in on
the loop, then finds them parsed (`parsed`) and reads again only a file that changed
since. A parse is used once (`parsed` takes it), and at most `KEEP` wait: a read ahead
whose exit is never taken in does not hold memory.

    read_ahead(path, parse, limit)      # in a worker thread (returns the parse too)
    parsed(path, parse, limit)          # on the loop: the parse of the file as it is now
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from argosy.core.confined import read_job_text, stat_job_file

KEEP = 4
"""Parses kept waiting for their exit (an exit reads at most two per node rank)."""

Parse = Callable[[str | None], Any]

_ahead: OrderedDict[tuple, Any] = OrderedDict()
_lock = threading.Lock()


def read_ahead(path: Path, parse: Parse, limit: int) -> Any:
    """Parse the job's file at `path` (at most `limit` bytes; a larger one is left for
    the loop to refuse), keep the result for `parsed` and return it (None: not read)."""
    key = _identity(path)
    if key is None or key[3] > limit:
        return None
    value = parse(read_job_text(path, limit=limit))
    with _lock:
        _ahead[key] = value
        while len(_ahead) > KEEP:
            _ahead.popitem(last=False)
    return value


def parsed(path: Path, parse: Parse, limit: int) -> Any:
    """`parse` of the job's file at `path` as it is now: read ahead if it has not
    changed since, else read here."""
    key = _identity(path)
    if key is not None:
        with _lock:
            if key in _ahead:
                return _ahead.pop(key)
    return parse(read_job_text(path, limit=limit))


def _identity(path: Path) -> tuple | None:
    found = stat_job_file(path)
    if found is None:
        return None
    return (str(path), found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
