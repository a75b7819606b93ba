"""The end state tells the truth: done + committed = completed, a close-time error is an event."""

from __future__ import annotations

import json
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
