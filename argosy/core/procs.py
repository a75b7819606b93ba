"""Processes of this machine seen through /proc: liveness and signalling by environment.

Launchers, executors and the checkpoint harness each need to find the processes a job left
behind (a rank in its own session, a lingering persister). They carry a marker variable in
their environment; `signal_by_env` finds them by it. Linux only, standard library only.

    signal_by_env("ARGOSY_JOB_ID", "job-7", signal.SIGKILL)   # -> how many were signalled
"""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def signal_by_env(key: str, value: str, sig: int) -> int:
    """Send `sig` to every process of this user (but this one) whose environment holds
    `key=value`; returns how many were signalled."""
    marker = f"{key}={value}".encode()
    hit = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), sig)
                hit += 1
        except OSError:
            continue  # gone, or another user's process
    return hit
