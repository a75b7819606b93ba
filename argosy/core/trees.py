"""Removing file trees that someone else made (a job's run directory, a job user's
leftovers): `rm -rf --one-file-system`, never Python's recursive removal.

Such a tree may be deep (`shutil.rmtree` recurses once per level and raises
RecursionError past about a thousand), hold links (`rm` removes a link itself, never its
target) and mounts (never crossed). `rm` acts with the caller's rights: run as a job's user,
it removes exactly what that user could.

    gone = remove_trees([Path("/tmp/a"), Path("/tmp/b")], timeout_s=600)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

BATCH = 256
"""Paths handed to one `rm` (a command line's size is limited)."""


def remove_trees(paths: list[Path], timeout_s: float | None = None) -> list[Path]:
    """`rm -rf --one-file-system` on `paths` (in batches, each given at most `timeout_s`);
    what may not be removed stays. Returns those gone after."""
    for i in range(0, len(paths), BATCH):
        batch = [str(p) for p in paths[i : i + BATCH]]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                ["rm", "-rf", "--one-file-system", "--", *batch],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # (what it may not remove: said per entry)
                timeout=timeout_s,
                check=False,
            )
    return [p for p in paths if not os.path.lexists(p)]
