"""The end state tells the truth: done + committed = completed, a close-time error is an event."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import argosy, summary

SCRIPT = """
import sys
from argosy.runtime import hooks
rt = hooks.attach()
rt.restored(0, target_step=3)
for step in range(1, 4):
    rt.step_begin(step)
    rt.step_end(step, 1.0 / step)
if {committed}:
    rt.committed(3)  # what ckpt.wait() returned: the last step is on disk
sys.exit(7)  # an error while closing (process group, persister, ...)
"""


def launch(tmp_path: Path, committed: bool) -> tuple[int, dict, list[dict]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(committed=committed))
    run = tmp_path / "run"
    done = argosy(
        "launch", "--quiet", "--nproc-per-node", "2", "--max-restarts", "0",
        "--run-dir", str(run), str(script),
    )  # fmt: skip
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    return done.returncode, summary(run), events


@pytest.mark.integration
def test_a_run_done_and_committed_that_fails_at_close_is_completed(tmp_path: Path) -> None:
    code, s, events = launch(tmp_path, committed=True)
    assert code == 0 and s["status"] == "completed" and s["final_step"] == 3
    assert s["restarts"] == 0 and s["faults"] == []
    closing = [e for e in events if e["event"] == "close_error"]
    assert {e["rank"] for e in closing} == {0, 1} and {e["exit_code"] for e in closing} == {7}
    assert [c["exit_code"] for c in s["close_errors"]] == [7, 7]
    assert [e["step"] for e in events if e["event"] == "commit"] == [3]
    assert s["last_commit"] == 3


@pytest.mark.integration
def test_a_run_whose_last_step_is_not_committed_fails(tmp_path: Path) -> None:
    code, s, events = launch(tmp_path, committed=False)
    assert code == 1 and s["status"] == "failed" and s["cause"]["kind"] == "exit"
    assert not [e for e in events if e["event"] == "close_error"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(
    "point, train",
    [
        ("copy:4:stall", ["--steps", "80", "--step-sleep", "0.1"]),  # a fence waits on it
        ("write:2:stall", ["--steps", "30"]),  # the last `wait` waits on it
    ],
    ids=["copy", "write"],
)
def test_a_wedged_persister_is_a_hang_caught_within_the_normal_threshold(
    tmp_path: Path, point: str, train: list[str]
) -> None:
    """No checkpoint grace: a checkpoint that stops moving is reported like any hang."""
    import os

    from runtime_helpers import EXAMPLE, REPO

    run = tmp_path / "run"
    env = dict(os.environ, ARGOSY_CKPT_CRASH=point)
    cmd = [sys.executable, "-m", "argosy", "--set", "runtime.hang_p99_factor=3"]
    cmd += ["launch", "--quiet", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "0", "--run-dir", str(run), str(EXAMPLE), *train]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    s = summary(run)
    assert s["cause"]["kind"] == "hang"
    fault = next(f for f in s["faults"] if f["kind"] == "hang")  # (+ straggler warnings)
    hang = next(
        json.loads(x) for x in (run / "events.jsonl").read_text().splitlines() if '"hang"' in x
    )
    # the normal rule, max(3 x p99 step, 5 s floor): no grace for checkpoints
    assert 5.0 <= hang["threshold_s"] < 10.0
    assert fault["detect_latency_s"] <= min(10.0, hang["threshold_s"] + 2.0)
