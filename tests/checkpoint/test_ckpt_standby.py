"""A persister started ahead (by the runtime's warm standby) is adopted by the next
checkpointer of its process, saves and restores like a cold one, and exits by itself when
nobody adopts it."""

from __future__ import annotations

import subprocess
import sys
import time

from argosy.core.procs import pid_alive

ADOPT = """
import sys, time, torch
from argosy.checkpoint import standby
from argosy.checkpoint.flash import FlashCheckpointer
standby.start()
ahead = standby._WAITING[0].pid
time.sleep(float(sys.argv[3]))  # the persister imports torch meanwhile
ck = FlashCheckpointer(sys.argv[1], keep=2, job_id=sys.argv[2], linger_s=0.0)
state = {"w": torch.arange(4096.0)}
ck.save(1, state)
ck.wait()
print("adopted", ck.persister_pid == ahead, "left", standby.waiting())
into = {"w": torch.zeros(4096)}
step, _ = ck.load(into=into)
print("restored", step, bool(torch.equal(into["w"], state["w"])))
ck.close()
"""

ORPHAN = """
from argosy.checkpoint import standby
standby.start()
print(standby._WAITING[0].pid, flush=True)
"""


def _python(code: str, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_persister_started_ahead_is_adopted_saves_and_restores(tmp_path, job, ck) -> None:
    for wait_s in ("0", "3"):  # adopted while it still imports torch, and once it waits
        out = _python(ADOPT, str(tmp_path / wait_s), job, wait_s, env=ck.env_with_repo())
        assert "adopted True left 0" in out
        assert "restored 1 True" in out


def test_a_persister_nobody_adopts_exits_with_its_trainer(ck) -> None:
    pid = int(_python(ORPHAN, env=ck.env_with_repo()).split()[0])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not pid_alive(pid):  # a zombie (its parent gone) counts as exited
            return
        time.sleep(0.2)
    raise AssertionError(f"the persister {pid} started ahead outlived its trainer")


ARMED = """
import os, sys, torch
from argosy.checkpoint import faultpoints, standby
from argosy.checkpoint.flash import FlashCheckpointer
standby.start()
os.environ[faultpoints.ENV] = "write:1:kill"  # the trainer's environment, after the start
ck = FlashCheckpointer(sys.argv[1], keep=2, job_id=sys.argv[2], linger_s=0.0)
ck.save(1, {"w": torch.arange(4096.0)})
try:
    ck.wait()
    print("saved")
except Exception as err:
    print("failed as armed:", type(err).__name__)
try:
    ck.close()
except Exception:
    pass  # its persister is dead: the slots it held are left, as after a SIGKILL
from argosy.checkpoint.segment import job_segments
for path in job_segments(sys.argv[2]):
    path.unlink()  # what the launcher does at the run's end
"""


def test_an_adopted_persister_takes_its_trainer_s_environment(tmp_path, job, ck) -> None:
    """Fault points (and whatever else the trainer's environment says) reach it, as they
    reach a persister the trainer starts itself."""
    out = _python(ARMED, str(tmp_path), job, env=ck.env_with_repo())
    assert "failed as armed" in out, out
