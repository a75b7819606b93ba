"""Through the API: a queue token that floods the cluster with jobs does not keep every
device that frees up; another queue's job, submitted after the flood, runs next
(`argosy.scheduler.queues.QueueTree.past_share`). A fake executor: no processes."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient
from server_helpers import fast_config, job_body

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app

QUEUES = "queues:\n  - name: org\n    children:\n      - name: a\n      - name: b\n"


def _wait_running(api: TestClient, fake: FakeExecutor, n: int) -> list[str]:
    deadline = time.monotonic() + 30  # a bound on a wait, not a speed check
    while len(fake.running) < n:
        assert time.monotonic() < deadline, "nothing was placed"
        time.sleep(0.02)
    return list(fake.running)


def test_the_next_freed_device_goes_to_the_queue_that_did_not_flood(tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    fake, home = FakeExecutor([NodeInfo("n0", "cpu", 1)]), tmp_path / "home"
    config = fast_config(home, queues_file=tmp_path / "queues.yaml")
    with TestClient(create_app(config, executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        flood = [api.post("/api/v1/jobs", json=job_body(f"a{i}", queue="a")) for i in range(8)]
        assert all(r.status_code == 201 for r in flood)
        first = _wait_running(api, fake, 1)
        victim = api.post("/api/v1/jobs", json=job_body("b", queue="b")).json()["id"]
        fake.finish(first[0], 0)
        deadline = time.monotonic() + 30
        while set(fake.running) in ({first[0]}, set()):
            assert time.monotonic() < deadline, "nothing was placed after the first job"
            time.sleep(0.02)
        assert list(fake.running) == [victim], api.get("/api/v1/jobs?state=running").json()
