"""A trainer SIGKILLed right after a save whose storages the persister had not yet taken
in: the storages' file descriptors travel through the trainer, so a persister that reads
them after the trainer died gets none. `save` returns only once the persister holds them,
so the step survives and the next attempt loads it from memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from argosy.checkpoint import FlashCheckpointer
from argosy.checkpoint.flash import reclaim
from argosy.core.procs import signal_by_env

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sources_trainer.py")
STOPPED_S = 1.5
"""How long the persister is held stopped while the trainer saves (and, before the fix,
died): long enough for a save that does not wait to return and kill its process."""


@pytest.mark.slow
def test_a_step_saved_from_new_storages_survives_a_kill_right_after_save(tmp_path, job, ck):
    env = {**ck.env_with_repo(), "ARGOSY_CKPT_JOB": job}
    cmd = [sys.executable, "-W", "ignore", TRAINER, str(tmp_path), job]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = proc.stdout.readline().split()
        assert first[:1] == ["PERSISTER"], first + proc.stderr.read().splitlines()[-5:]
        persister = int(first[1])
        os.kill(persister, signal.SIGSTOP)  # it reads the next messages late
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            time.sleep(STOPPED_S)
        finally:
            os.kill(persister, signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err
        assert "SAVED 1" in out
        reader = FlashCheckpointer(tmp_path, job_id=job, prestart=False)
        try:
            step, state = reader.load()
            source = reader.last_load_source
        finally:
            reader.close()
        assert (step, source) == (1, "memory"), reader.last_decision
        assert float(state["w"].sum()) == 256 * 256
    finally:
        proc.kill()
        proc.wait()
        signal_by_env("ARGOSY_CKPT_JOB", job, signal.SIGKILL)  # the lingering persister
        time.sleep(0.2)
        reclaim(job)
