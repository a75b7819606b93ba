"""Faults while jobs run: the server SIGKILLed and restarted, a job's launcher killed.

Nothing submitted is lost, running attempts are adopted (never started twice), a killed
attempt fails and the job resumes from its checkpoint, and the event log says why.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import SCRIPTS, TERMINAL, ServerProcess, job_body, wait_for

PROGRESS = str(SCRIPTS / "progress.py")
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def starts(home: Path, job_id: str) -> list[tuple[int, int]]:
    """(pid, first step) of every start of the job's script."""
    path = home / "runs" / job_id / "starts.txt"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(int(a), int(b)) for a, b in (line.split() for line in lines if line)]


def steps_done(home: Path, job_id: str) -> int:
    path = home / "runs" / job_id / "ckpt.txt"
    return int(path.read_text()) if path.exists() else 0


def wait_until(predicate, timeout_s: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_server_sigkill_loses_nothing_and_runs_no_job_twice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = ServerProcess(home)
    server.start()
    slow = ["--steps", "200", "--step-s", "0.1"]  # outlives a server restart under load
    with server.client() as c:
        running = [c.post("/api/v1/jobs", json=job_body(f"r{i}", args=slow)).json() for i in (0, 1)]
        queued = c.post("/api/v1/jobs", json=job_body("q", nproc_per_node=2)).json()
        for job in running:
            wait_for(c, job["id"], {"running"})
        wait_until(lambda: all(steps_done(home, j["id"]) >= 3 for j in running))
    server.kill()
    time.sleep(0.5)  # the attempts keep training while no server runs
    server.start()
    with server.client() as c:
        for job in [*running, queued]:
            assert c.get(f"/api/v1/jobs/{job['id']}").status_code == 200  # nothing lost
        for job in running:
            assert c.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "running"
            kinds = [e["kind"] for e in c.get(f"/api/v1/jobs/{job['id']}/events").json()["items"]]
            assert "adopted" in kinds
        for job in [*running, queued]:
            done = wait_for(c, job["id"], TERMINAL, timeout_s=60)
            assert done["state"] == "succeeded" and done["attempts"] == 1, done
            ranks = job["spec"]["nproc_per_node"]
            assert [step for _, step in starts(home, job["id"])] == [1] * ranks  # ran once
    server.kill()


def test_killed_launcher_fails_the_attempt_and_the_job_resumes(
    client: TestClient, home: Path
) -> None:
    body = job_body("k", args=["--steps", "30", "--step-s", "0.1"], checkpoint_every=2)
    job = client.post("/api/v1/jobs", json=body).json()
    wait_for(client, job["id"], {"running"})
    wait_until(lambda: steps_done(home, job["id"]) >= 6)
    attempt = home / "runs" / job["id"] / "server" / "attempt1"
    first_rank = starts(home, job["id"])[0][0]
    os.kill(int((attempt / "launch.pid").read_text()), signal.SIGKILL)
    done = wait_for(client, job["id"], TERMINAL, timeout_s=60)
    assert done["state"] == "succeeded" and done["attempts"] == 2, done
    (_, first), (_, resumed) = starts(home, job["id"])
    assert first == 1 and resumed >= 7 and resumed % 2 == 1  # after an even checkpoint
    with pytest.raises(ProcessLookupError):
        os.kill(first_rank, 0)  # the orphaned rank of attempt 1 was stopped
    events = client.get(f"/api/v1/jobs/{job['id']}/events").json()["items"]
    lost = [e["message"] for e in events if e["kind"] == "attempt_lost"]
    assert len(lost) == 1 and "SIGKILL" in lost[0] and "checkpoint" in lost[0]
    assert done["summary"]["status"] == "completed" and done["summary"]["attempt"] == 2
    kept = home / "runs" / job["id"] / "server"
    first_summary = json.loads((kept / "attempt1" / "summary.json").read_text())
    assert first_summary["status"] == "missing" and "SIGKILL" in first_summary["detail"]
    second = json.loads((kept / "attempt2" / "summary.json").read_text())
    assert second == {k: v for k, v in done["summary"].items() if k != "job"}
    assert done["summary"]["job"]["attempts"] == 2  # the job's account over both attempts


def test_a_job_s_goodput_counts_its_lost_attempt_and_the_wait(
    client: TestClient, home: Path
) -> None:
    """The summary's `job` accounts every attempt: the steps of the killed one that the
    next resumed past are productive (from its event log: its launcher wrote no
    summary), its other time and the requeue are lost."""
    args = ["--steps", "24", "--step-s", "0.1", "--ckpt-every", "2"]
    job = client.post("/api/v1/jobs", json=job_body("g", script=PROGRESS, args=args)).json()
    wait_for(client, job["id"], {"running"})
    wait_until(lambda: steps_done(home, job["id"]) >= 8)
    pid = home / "runs" / job["id"] / "server" / "attempt1" / "launch.pid"
    os.kill(int(pid.read_text()), signal.SIGKILL)
    done = wait_for(client, job["id"], TERMINAL, timeout_s=60)
    assert done["state"] == "succeeded" and done["attempts"] == 2, done
    last, account = done["summary"], done["summary"]["job"]
    assert last["resumed_from"] >= 8 and last["final_step"] == 24
    step_s = last["productive_s"] / (24 - last["resumed_from"])
    first = json.loads((pid.parent / "summary.json").read_text())
    assert first["status"] == "missing" and "SIGKILL" in first["detail"]
    # its event log is read up to its last event, which may lag its newest checkpoint
    # (the launcher logs a step after the rank reports it): then nothing was redone
    assert first["from_events"] and first["final_step"] >= last["resumed_from"] - 2, first
    assert account["attempts"] == 2 and account["estimated"] == []
    assert account["restarts"] == last["restarts"] + 1 and account["faults"] >= 1
    assert account["wall_s"] > last["span_s"][1] - last["span_s"][0]
    credited = account["productive_s"] - last["productive_s"]  # attempt 1's kept steps
    redone = max(0, first["final_step"] - last["resumed_from"]) * step_s
    assert credited == pytest.approx(first["productive_s"] - redone, abs=0.01)
    assert account["lost_s"]["redone_after_loss"] == pytest.approx(redone, abs=0.01)
    assert account["effective_training_time"] < last["effective_training_time"]
    assert account["lost_s"]["outside_launcher"] > 0  # attempt 1 beyond its kept steps
    total = account["productive_s"] + sum(account["lost_s"].values())
    assert total == pytest.approx(account["wall_s"], abs=0.01)


def test_attempts_lost_beyond_max_restarts_fail_the_job(client: TestClient, home: Path) -> None:
    body = job_body("m", args=["--steps", "100", "--step-s", "0.1"], max_restarts=0)
    job = client.post("/api/v1/jobs", json=body).json()
    wait_for(client, job["id"], {"running"})
    pid_file = home / "runs" / job["id"] / "server" / "attempt1" / "launch.pid"
    wait_until(pid_file.exists)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    done = wait_for(client, job["id"], TERMINAL)
    assert done["state"] == "failed" and "max_restarts=0" in done["reason"]
    assert done["summary"]["status"] == "missing" and done["summary"]["attempt"] == 1
