"""The control loop answers requests between the parts of a pass: a burst of starts (each
a process, a cgroup, perhaps a user on a real executor) does not hold the API for all of
them, and what a request changes meanwhile (a cancel) is respected by the starts after it.

The executor here is the fake whose `start` takes `START_S` of the loop's thread, as a
real one's process and cgroup setup do."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import STEPS, WORKDIR, fast_config

from argosy.executors.base import LaunchRequest, NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app

START_S = 0.15
JOBS = 8


class SlowStarts(FakeExecutor):
    """A fake executor whose starts block the calling thread, as real ones do."""

    def __init__(self) -> None:
        super().__init__([NodeInfo("n0", "cpu", JOBS)])
        self.first = threading.Event()

    def start(self, request: LaunchRequest) -> None:
        time.sleep(START_S)  # the loop's thread: a process, a cgroup, a user
        super().start(request)
        self.first.set()


@pytest.fixture
def burst(home: Path) -> Iterator[tuple[TestClient, SlowStarts, list[str]]]:
    """A server whose one node was cordoned while `JOBS` jobs were queued: uncordoning it
    makes one scheduling cycle decide all their starts."""
    fake = SlowStarts()
    with TestClient(create_app(fast_config(home), executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        assert api.post("/api/v1/nodes/n0/cordon").status_code == 200
        body = {"name": "b", "script": STEPS, "workdir": WORKDIR, "max_restarts": 0}
        ids = [api.post("/api/v1/jobs", json=body).json()["id"] for _ in range(JOBS)]
        yield api, fake, ids


def test_requests_are_answered_while_a_burst_of_starts_runs(burst) -> None:
    api, fake, _ = burst
    assert api.post("/api/v1/nodes/n0/uncordon").status_code == 200
    assert fake.first.wait(60)
    assert api.get("/api/v1/health").status_code == 200
    answered_after = len(fake.started)
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while len(fake.started) < JOBS:
        assert time.monotonic() < deadline, fake.started
        time.sleep(0.02)
    assert answered_after < JOBS, "the request waited for every start of the burst"


def test_a_job_cancelled_while_the_burst_starts_is_never_started(burst, caplog) -> None:
    api, fake, ids = burst
    last = ids[-1]
    assert api.post("/api/v1/nodes/n0/uncordon").status_code == 200
    assert fake.first.wait(60)
    assert api.post(f"/api/v1/jobs/{last}/cancel").status_code == 200
    assert last not in {job_id for job_id, _ in fake.started}, "answered after the burst"
    deadline = time.monotonic() + 60
    while len(fake.started) < JOBS - 1:
        assert time.monotonic() < deadline, fake.started
        time.sleep(0.02)
    time.sleep(3 * START_S)  # the rest of the pass
    assert last not in {job_id for job_id, _ in fake.started}
    assert api.get(f"/api/v1/jobs/{last}").json()["state"] == "cancelled"
    assert not [r for r in caplog.records if "step failed" in r.getMessage()]  # skipped
