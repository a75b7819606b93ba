"""A reused run directory: the previous run's files move under history/, shared ones stay."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from argosy.runtime.history import RunDirBusyError, archive_previous, list_history


def fake_run(run: Path, run_id: str, pid: int, ended: bool = True) -> None:
    events = [{"event": "start", "t": 0.0, "run_id": run_id, "launcher_pid": pid}]
    if ended:
        events.append({"event": "end", "t": 1.0, "status": "completed"})
    (run / "logs" / "attempt0").mkdir(parents=True, exist_ok=True)
    (run / "logs" / "attempt0" / "rank0.log").write_text(run_id)
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "summary.json").write_text(json.dumps({"status": "completed", "final_step": 7}))
    (run / "mixed").mkdir(exist_ok=True)
    (run / "mixed" / "throughput.json").write_text("{}")


def test_the_previous_run_moves_and_shared_files_stay(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert archive_previous(run) is None  # nothing to archive yet
    fake_run(run, "first", pid=os.getpid())
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step5").write_text("weights")
    (run / "mixed" / "assignment.json").write_text("{}")  # written for the new run
    target = archive_previous(run)
    assert target is not None and target.name == "001-first"
    assert (target / "logs" / "attempt0" / "rank0.log").read_text() == "first"
    assert (target / "mixed" / "throughput.json").exists()
    assert not (run / "events.jsonl").exists() and not (run / "logs").exists()
    assert (run / "checkpoints" / "step5").exists() and (run / "mixed" / "assignment.json").exists()
    fake_run(run, "second", pid=os.getpid())
    archive_previous(run)
    earlier = list_history(run)
    assert [r["run_id"] for r in earlier] == ["first", "second"]
    assert earlier[0]["status"] == "completed" and earlier[0]["final_step"] == 7


def test_a_run_whose_launcher_still_runs_is_not_moved(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    fake_run(run, "live", pid=os.getpid(), ended=False)  # this process is alive
    with pytest.raises(RunDirBusyError, match=f"pid {os.getpid()}"):
        archive_previous(run)
    assert (run / "events.jsonl").exists()
