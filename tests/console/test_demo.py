"""`argosy demo` end to end, non-interactive: a real server process, a real training job
killed once mid-run, its resume, and the goodput report at the end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_runs_a_job_through_a_fault_and_prints_its_goodput(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cmd = [sys.executable, "-m", "argosy", "demo", "--no-service", "--port", "0"]
    cmd += ["--steps", "14", "--fault-step", "6", "--home", str(home), "--timeout-s", "240"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    token = (home / "admin.token").read_text().strip()
    assert f"admin token: {token}" in text
    assert re.search(r"console:\s+http://127\.0\.0\.1:\d+/", text)
    assert "fault: rank 0 killed by signal 9" in text
    injected = re.search(r"injected: SIGKILL to rank 0 after step (\d+)", text)
    assert injected and int(injected.group(1)) >= 6, text  # never before its step
    resumed = re.search(r"resumed attempt 1 from step (\d+)", text)
    assert resumed and int(resumed.group(1)) >= 5, text  # from a checkpoint, not step 0
    assert re.search(r"effective training time \d+\.\d%; 1 restart\(s\), 1 fault\(s\)", text)
    assert "succeeded" in text


def test_demo_refuses_a_fault_after_the_last_step() -> None:
    cmd = [sys.executable, "-m", "argosy", "demo", "--steps", "10", "--fault-step", "10"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--fault-step 10 must be below --steps 10" in out.stderr
    assert "Traceback" not in out.stderr


def test_demo_with_a_service_leaves_no_process_behind(tmp_path: Path) -> None:
    from argosy.core.procs import signal_by_env

    home = tmp_path / "home"
    cmd = [sys.executable, "-m", "argosy", "demo", "--port", "0", "--steps", "6"]
    cmd += ["--fault-step", "0", "--home", str(home), "--timeout-s", "240"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "service demo-chat: running (http://127.0.0.1:" in out.stdout, out.stdout
    assert re.search(r"it answered in \d+\.\d s \(\d+ tokens\)", out.stdout), out.stdout
    assert signal_by_env("ARGOSY_HOME", str(home), 0) == 0  # no replica, no warm launcher
