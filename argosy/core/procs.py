"""Processes of this machine seen through /proc: liveness and signalling by environment.

Launchers, executors and the checkpoint harness each need to find the processes a job left
behind (a rank in its own session, a lingering persister). They carry a marker variable in
their environment; `signal_by_env` finds them by it. A pid read from a file may name a
stranger by now (pids wrap, at 32,768 on many hosts): `env_holds` and `start_ticks` tell
the two apart before anything is signalled. Linux only, standard library only.

    signal_by_env("ARGOSY_JOB_ID", "job-7", signal.SIGKILL)   # -> how many were signalled

`tell(proc, message, last)` writes one JSON line to a child waiting on its stdin (a warm
standby, a persister started ahead), closing that stdin after the last.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
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


def env_holds(pid: int, key: str, value: str) -> bool:
    """Whether the environment `pid` started with holds `key=value` (False when it is gone
    or another user's): how a pid read from a file is told from a stranger reusing it."""
    try:
        return f"{key}={value}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (-1 if it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def signal_by_env(key: str, value: str, sig: int) -> int:
    """Send `sig` to every process of this user (but this one) whose environment holds
    `key=value`; returns how many were signalled."""
    hit = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        if env_holds(int(entry.name), key, value):
            with contextlib.suppress(OSError):  # gone since
                os.kill(int(entry.name), sig)
                hit += 1
    return hit


def tell(proc: subprocess.Popen, message: dict, last: bool) -> bool:
    """One JSON line to `proc`'s stdin (closed after the `last`); False if it is gone."""
    if proc.poll() is not None or proc.stdin is None:
        return False
    try:
        proc.stdin.write((json.dumps(message) + "\n").encode())
        if last:
            proc.stdin.close()
        else:
            proc.stdin.flush()
    except OSError:  # BrokenPipeError included: it died meanwhile
        return False
    return True
