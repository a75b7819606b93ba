"""A job's logs as users follow them: a rank on any node of a multi-node attempt, and a
follower that moves to a newer attempt's log from its start instead of carrying its
old byte offset into the new file (a broken half-line and hundreds of lost steps)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fastapi.testclient import TestClient
from server_helpers import STEPS, WORKDIR

from argosy.executors.fake import FakeExecutor
from argosy.server.views import latest_rank_log, log_name


def _write(path: Path, text: str, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_a_rank_on_another_node_has_its_log_found(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write(run / "logs" / "attempt0" / "rank0.log", "r0")
    _write(run / "node1" / "logs" / "attempt0" / "rank1.log", "r1")
    _write(run / "node1" / "logs" / "attempt0" / "rank0.log", "old", mtime=1.0)  # stale
    assert latest_rank_log(run, 1) == run / "node1" / "logs" / "attempt0" / "rank1.log"
    assert latest_rank_log(run, 0) == run / "logs" / "attempt0" / "rank0.log"  # the newer
    assert latest_rank_log(run, 5) is None
    (run / "node2").symlink_to(run / "node1")  # a node directory that is a link: not read
    _write(run / "nodeX" / "logs" / "attempt0" / "rank7.log", "not a node's")
    assert latest_rank_log(run, 7) is None


def _archive(run_dir: Path, n: int) -> None:
    """What a new launcher does first: the previous run's logs move under history/."""
    (run_dir / "history" / f"{n:03d}").mkdir(parents=True)
    (run_dir / "logs").rename(run_dir / "history" / f"{n:03d}" / "logs")


def test_a_log_s_name_is_the_file_not_the_server_s_attempt_counter(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "attempt0" / "rank0.log"
    _write(log, "one\n")
    name = log_name(tmp_path, log)
    _write(log, "one\ntwo\n")  # appended to, or the job requeued but not yet relaunched
    assert log_name(tmp_path, log) == name
    _archive(tmp_path, 1)
    assert log_name(tmp_path, log) == ""  # between the archive and the new launcher's log
    _write(log, "new\n")
    assert log_name(tmp_path, log) not in (name, "")  # the new launcher's own file


def test_a_follower_of_an_older_log_reads_the_newer_one_from_its_start(
    api: TestClient, fake: FakeExecutor
) -> None:
    body = {"name": "f", "script": STEPS, "workdir": WORKDIR, "max_restarts": 2}
    job_id = api.post("/api/v1/jobs", json=body).json()["id"]
    deadline = time.monotonic() + 60
    while job_id not in fake.running:
        assert time.monotonic() < deadline, "not placed"
        time.sleep(0.02)
    log = fake.running[job_id].run_dir / "logs" / "attempt0" / "rank0.log"
    _write(log, "attempt one: step 1\nstep 2\nstep 3\n")
    first = api.get(f"/api/v1/jobs/{job_id}/logs")
    name, offset = first.headers["x-log-file"], int(first.headers["x-next-offset"])
    assert first.text.startswith("attempt one") and name
    fake.finish(job_id, None)  # lost: the next attempt's launcher starts the log again
    while (job_id, 2) not in fake.started:
        assert time.monotonic() < deadline, "no second attempt"
        time.sleep(0.02)
    gap = api.get(f"/api/v1/jobs/{job_id}/logs", params={"offset": offset, "file": name})
    assert (gap.text, gap.headers["x-log-file"]) == ("", name)  # admitted, not relaunched
    _archive(fake.running[job_id].run_dir, 1)
    _write(log, "two: resumed from step 2\nstep 3\n")
    params = {"offset": offset, "file": name}
    again = api.get(f"/api/v1/jobs/{job_id}/logs", params=params)
    assert again.text == "two: resumed from step 2\nstep 3\n"
    assert again.headers["x-log-file"] != name
    current = {"offset": 5, "file": again.headers["x-log-file"]}
    same = api.get(f"/api/v1/jobs/{job_id}/logs", params=current)
    assert same.text == "resumed from step 2\nstep 3\n"  # the same log: its offset holds


def test_a_rank_the_job_does_not_have_is_a_404_naming_its_ranks(
    api: TestClient, fake: FakeExecutor
) -> None:
    body = {"name": "r", "script": STEPS, "workdir": WORKDIR, "nproc_per_node": 2}
    job_id = api.post("/api/v1/jobs", json=body).json()["id"]
    assert api.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 1}).status_code == 200
    r = api.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 5})
    assert r.status_code == 404 and "has ranks 0..1" in r.json()["detail"], r.text
    assert api.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": "launcher"}).is_success
