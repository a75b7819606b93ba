"""A trainer killed (SIGKILL, or SIGTERM as the launcher stops the surviving ranks) before
its persister answered `ready`: the snapshots it held itself are what the next attempt
loads, from memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from argosy.checkpoint.flash import reclaim
from argosy.checkpoint.persister import _owner_of
from argosy.checkpoint.segment import SHM_DIR, held_name
from argosy.core.procs import pid_alive, signal_by_env

HELD_TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "held_trainer.py")
PERSISTER_DELAY_S = 3.0
"""Before its imports (seconds more): both saves and the kill come first, even under load."""


def _run(ck, *args: str) -> tuple[int, list[str]]:
    cmd = [sys.executable, "-W", "ignore", HELD_TRAINER, *args]
    env = {**ck.env_with_repo(), "ARGOSY_CKPT_JOB": args[1]}  # so its persisters can be found
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    return proc.returncode, proc.stdout.split("\n") + proc.stderr.split("\n")[-5:]


def _wait_adopted(job: str, timeout_s: float = 60.0) -> None:
    """Until the dead trainer's orphaned persister has adopted its held slots."""
    deadline = time.monotonic() + timeout_s
    paths = [SHM_DIR / held_name(job, 0, i) for i in range(2)]
    while not all(pid_alive(_owner_of(p)) for p in paths):
        assert time.monotonic() < deadline, "the orphaned persister never adopted the slots"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "adopted"), [("KILL", False), ("TERM", True)], ids=["kill-early", "term-adopted"]
)
def test_snapshots_held_before_the_persister_started_survive_the_trainer(
    tmp_path, job, ck, sig, adopted
):
    """Loaded before the late persister starts (kill-early), or once it adopted them."""
    try:
        delay = str(PERSISTER_DELAY_S)
        rc, out = _run(ck, str(tmp_path), job, delay, "save", sig)
        assert rc == -getattr(signal, f"SIG{sig}"), out
        assert [line for line in out if line.startswith("HELD")] == [
            "HELD 0 False",
            "HELD 1 False",
        ], out
        if adopted:
            _wait_adopted(job)
        rc, out = _run(ck, str(tmp_path), job, "0", "load")
        assert rc == 0, out
        loaded = next(line.split() for line in out if line.startswith("LOADED"))
        assert loaded[1:] == ["1", "memory", "2.0"], out
    finally:
        signal_by_env("ARGOSY_CKPT_JOB", job, signal.SIGKILL)  # a late or lingering persister
        time.sleep(0.2)
        reclaim(job)
