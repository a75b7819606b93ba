"""Starting a rank's persister process, and the socket directory it connects back through.

    handle = start_persister(spec, log_dir)      # returns at once; the persister imports torch
    handle.poll_connected()                      # True once it connected
    handle.close()                               # the socket directory is gone on every path

Contract:
- The persister is a plain subprocess in its own session (`python -m
  argosy.checkpoint.persister ADDRESS`), not multiprocessing's spawn (that re-imports the
  training script), so a SIGKILL of the trainer or its process group does not reach it.
  Its stdin and stdout are /dev/null and its stderr is appended to
  `<log_dir>/persister-r<rank>.log` (never the trainer's pipes: an orphan would hold them).
- It connects back over a Unix socket in a private directory `argosy-ckpt-<pid>-*` under
  the temp dir, authenticated with this process's multiprocessing key (which the persister
  adopts so it can receive shared-memory handles). The directory is removed as soon as the
  connection is made or has failed, and by `close()`; `reap_socket_dirs()` removes those
  of processes that died before (SIGKILLed while their persister started). Nothing of
  this module is left in the temp dir once its process is gone and a later one started.
- A persister started ahead by the runtime's warm standby (`standby.py`) is adopted
  first when one waits: it has imported torch already.
- Its environment (`persister_env`) is the trainer's, plus glibc's tunable that makes
  `memmove` use non-temporal stores from `NON_TEMPORAL_BYTES` on (glibc's own threshold
  here was 288 MiB, above every piece of a snapshot's copy), unless the caller set that
  tunable: a copy of fresh bytes into a slot that nothing reads soon then skips reading the
  slot's lines into the cache first (~20% faster than torch's copy of the same bytes on the
  VM this was built on; benchmarks/RESULTS.md). Where glibc is not x86's, it is ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from argosy.checkpoint import standby
from argosy.core.procs import pid_alive

SOCKET_PREFIX = "argosy-ckpt-"
_OWNED = re.compile(rf"^{SOCKET_PREFIX}(\d+)-")
NON_TEMPORAL_BYTES = 256 << 10
"""Copies at least this large use non-temporal stores in the persister (x86 glibc)."""
_NON_TEMPORAL_TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
_UNOWNED_MAX_AGE_S = 3600.0
"""Directories of the old naming (no owner pid): removed once this old."""


class PersisterHandle:
    """A started persister: its process, and its connection once it connected."""

    def __init__(self, proc: subprocess.Popen, sockdir: str, listener: Any) -> None:
        self.proc = proc
        self.sockdir = sockdir
        self.conn: Any = None
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        try:
            self.conn = self._listener.accept()
        except OSError:
            pass
        finally:
            self._listener.close()
            self._remove_sockdir()

    def _remove_sockdir(self) -> None:
        shutil.rmtree(self.sockdir, ignore_errors=True)

    def poll_connected(self, wait_s: float = 0.01) -> bool:
        if self.conn is None:
            self._acceptor.join(timeout=wait_s)
        return self.conn is not None

    def close(self) -> None:
        """Close the connection and remove the socket directory (idempotent)."""
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        with contextlib.suppress(OSError):
            self._listener.close()  # an accept still waiting returns
        self._remove_sockdir()


def start_persister(spec: Any, log_dir: Path) -> PersisterHandle:
    """Start the persister of `spec` (a PersisterSpec); see the module docstring."""
    import multiprocessing
    from multiprocessing.connection import Listener

    import torch.multiprocessing  # noqa: F401  # registers the tensor-sharing reducers

    reap_socket_dirs()
    key = bytes(multiprocessing.current_process().authkey)
    sockdir = tempfile.mkdtemp(prefix=f"{SOCKET_PREFIX}{os.getpid()}-")
    try:
        address = os.path.join(sockdir, "persister.sock")
        listener = Listener(address, family="AF_UNIX", authkey=key)
        own = {
            "ARGOSY_PERSISTER_KEY": key.hex(),
            "ARGOSY_PERSISTER_SPEC": json.dumps(dataclasses.asdict(spec)),
        }
        env = persister_env(os.environ) | own
        proc = standby.adopt(address, env, _log_path(log_dir, spec.rank))
        if proc is None:
            proc = _start_cold(address, env, log_dir, spec.rank)
    except BaseException:
        shutil.rmtree(sockdir, ignore_errors=True)
        raise
    return PersisterHandle(proc, sockdir, listener)


def persister_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` with the non-temporal copy threshold added to GLIBC_TUNABLES (see the module
    doc); a threshold the caller set is kept, and so is every other tunable."""
    tunables = [t for t in base.get("GLIBC_TUNABLES", "").split(":") if t]
    if any(t.split("=", 1)[0] == _NON_TEMPORAL_TUNABLE for t in tunables):
        return dict(base)
    tunables.append(f"{_NON_TEMPORAL_TUNABLE}={NON_TEMPORAL_BYTES:#x}")
    return dict(base) | {"GLIBC_TUNABLES": ":".join(tunables)}


def _start_cold(address: str, env: dict[str, str], log_dir: Path, rank: int) -> Any:
    """A persister started now (it imports torch before it connects)."""
    log = _open_log(log_dir, rank)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "argosy.checkpoint.persister", address],
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


def _log_path(log_dir: Path, rank: int) -> Path | None:
    """`<log_dir>/persister-r<rank>.log`, its folder made; None if it cannot be."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return log_dir / f"persister-r{rank}.log"


def _open_log(log_dir: Path, rank: int) -> Any:
    """The persister's stderr: `<log_dir>/persister-r<rank>.log`, if writable."""
    path = _log_path(log_dir, rank)
    try:
        return open(path, "ab") if path else subprocess.DEVNULL  # noqa: SIM115
    except OSError:
        return subprocess.DEVNULL


def reap_socket_dirs(tmp: str | None = None) -> list[Path]:
    """Remove socket directories whose owner process is gone; returns what was removed."""
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    try:
        children = list(root.iterdir())
    except OSError:
        return removed
    now = time.time()
    for child in children:
        if not child.name.startswith(SOCKET_PREFIX) or not child.is_dir():
            continue
        owned = _OWNED.match(child.name)
        try:
            if owned is not None:
                stale = not pid_alive(int(owned.group(1)))
            else:
                stale = now - child.stat().st_mtime > _UNOWNED_MAX_AGE_S
        except OSError:
            continue
        if stale:
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process, in clock ticks (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[-1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None
