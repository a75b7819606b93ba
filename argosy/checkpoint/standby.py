"""A persister started ahead of its trainer: torch imported, waiting for its assignment.

A restarted rank's first saves wait for a new persister that imports torch (or hold the
state aside meanwhile), seconds that slow the first steps of every attempt. The runtime's
warm standby, the process that becomes the restarted rank, starts one ahead (`start`)
once the attempt it may replace has taken checkpoints. `start_persister` then hands the
first one waiting (`adopt`) the socket address, key, spec and log of the trainer that
adopts it, as one JSON line on its stdin, and starts a persister cold when none waits.
A waiting persister whose stdin closes (its trainer exited without adopting it) exits
quietly.

    standby.start()                                   # in the warm standby, early
    proc = standby.adopt(address, env, log_path)      # start_persister; None: start cold
    address = standby.await_assignment()              # the persister's side
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from argosy.core.procs import tell

STANDBY_ARG = "--standby"
"""The persister's argument in place of an address: wait for one on stdin."""
_WAITING: list[subprocess.Popen] = []


def start() -> None:
    """Start one persister that imports torch now and waits for this process to adopt it."""
    from argosy.checkpoint.launch import persister_env

    proc = subprocess.Popen(
        [sys.executable, "-m", "argosy.checkpoint.persister", STANDBY_ARG],
        env=persister_env(os.environ),
        start_new_session=True,  # like a cold one: a SIGKILL of the trainer's group spares it
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _WAITING.append(proc)


def waiting() -> int:
    """Persisters started ahead and not adopted yet (alive or not)."""
    return len(_WAITING)


def adopt(address: str, env: dict[str, str], log: Path | None) -> subprocess.Popen | None:
    """The first waiting persister, told to serve `address` with `env` (the trainer's,
    with its key and spec) and to write its stderr to `log`; None when none is alive."""
    job = {"address": address, "env": env, "log": str(log) if log else ""}
    while _WAITING:
        proc = _WAITING.pop(0)
        if tell(proc, job, last=True):
            return proc
    return None


def await_assignment() -> str | None:
    """In a waiting persister: the address to serve once a trainer adopted it (its
    environment updated, stderr appended to its log); None when none ever will."""
    line = sys.stdin.readline()
    if not line:
        return None
    job = json.loads(line)
    os.environ.clear()  # the trainer's, as a persister it started would have had
    os.environ.update(job["env"])
    from argosy.checkpoint import faultpoints

    faultpoints.from_environment()
    if job["log"]:
        with contextlib.suppress(OSError):
            fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 2)
            os.close(fd)
    return str(job["address"])
