"""Job users may not leave work for later: cron and at refuse them.

An attempt's cgroup ends everything the job starts, but not what it asks a system
daemon to start for it: a `crontab` entry or an `at` job runs later as the job's user, in
the daemon's cgroup, after the job has ended. Both tools honour a deny file (`man
crontab`, `man at`): where the tool is installed and no allow file exists (an allow
file admits only the users it lists, so a job user is not in it unless an operator put
it there), the job user's name is added to the deny file, once.

    deny_timed_jobs("argosy-job-team-a")    # the tools (of TOOLS) it was denied
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimedTool:
    """A tool that runs a user's work later, and the files that say who may use it."""

    command: str
    deny: Path
    allow: Path


TOOLS = (
    TimedTool("crontab", Path("/etc/cron.deny"), Path("/etc/cron.allow")),
    TimedTool("at", Path("/etc/at.deny"), Path("/etc/at.allow")),
)


def deny_timed_jobs(name: str, tools: tuple[TimedTool, ...] = TOOLS) -> list[str]:
    """Add `name` to the deny file of each installed tool that has no allow file; the
    commands it was newly denied. An OSError (a read-only /etc) is logged, not raised:
    the job still runs in its cgroup, and the docs name the deny files."""
    denied = []
    for tool in tools:
        if shutil.which(tool.command) is None or tool.allow.exists():
            continue
        try:
            if _listed(tool.deny, name):
                continue
            _append_line(tool.deny, name)
        except OSError as err:
            log.warning(
                "could not deny %s to job user %s in %s: %s", tool.command, name, tool.deny, err
            )
            continue
        denied.append(tool.command)
    return denied


def _listed(path: Path, name: str) -> bool:
    try:
        return name in path.read_text().split()
    except FileNotFoundError:
        return False


def _append_line(path: Path, line: str) -> None:
    """`line` at the end of `path` (made 0644 when missing, as cron and at expect), on a
    line of its own even where the file's last line has no newline."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    try:
        size = os.fstat(fd).st_size
        ends_open = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, (("\n" if ends_open else "") + line + "\n").encode())
    finally:
        os.close(fd)
