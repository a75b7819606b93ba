"""Through the API: a queue token that floods the cluster with jobs does not keep every
device that frees up; another queue's job, submitted after the flood, runs next
(`argosy.scheduler.queues.QueueTree.past_share`). A fake executor: no processes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import fast_config, job_body, wait_for

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig

QUEUES = "queues:\n  - name: org\n    children:\n" + "".join(f"      - name: {q}\n" for q in "abc")


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


def test_a_queue_may_keep_only_so_many_jobs_waiting(tmp_path: Path) -> None:
    """Past `max_pending_jobs_per_queue` waiting jobs a submit is a 429 naming the limit,
    for that queue only; a used Idempotency-Key still answers its job; once one starts,
    the queue may submit again."""
    (tmp_path / "queues.yaml").write_text(QUEUES)
    fake, home = FakeExecutor([NodeInfo("n0", "cpu", 1)]), tmp_path / "home"
    config = fast_config(home, queues_file=tmp_path / "queues.yaml", max_pending_jobs_per_queue=3)
    with TestClient(create_app(config, executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        running = api.post("/api/v1/jobs", json=job_body("a-run", queue="a")).json()["id"]
        _wait_running(api, fake, 1)
        keyed = {"Idempotency-Key": "k1"}
        first = api.post("/api/v1/jobs", json=job_body("a0", queue="a"), headers=keyed)
        waiting = [api.post("/api/v1/jobs", json=job_body(f"a{i}", queue="a")) for i in (1, 2)]
        assert [r.status_code for r in (first, *waiting)] == [201, 201, 201]
        refused = api.post("/api/v1/jobs", json=job_body("a3", queue="a"))
        assert refused.status_code == 429, refused.text
        assert "max_pending_jobs_per_queue: 3" in refused.json()["detail"]
        again = api.post("/api/v1/jobs", json=job_body("a0", queue="a"), headers=keyed)
        assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
        other = api.post("/api/v1/jobs", json=job_body("b0", queue="b"))
        assert other.status_code == 201, other.text  # another queue is not held back
        fake.finish(running, 0)
        _wait_running(api, fake, 1)  # one of a's waiting jobs starts (or b's)
        deadline = time.monotonic() + 30
        while api.post("/api/v1/jobs", json=job_body("a4", queue="a")).status_code == 429:
            assert time.monotonic() < deadline, "a stays full after one of its jobs started"
            if fake.running:  # the loop may not have started the next one yet
                fake.finish(next(iter(fake.running)), 0)
            time.sleep(0.05)


def _one_device(tmp_path: Path) -> tuple[ServerConfig, FakeExecutor]:
    """A server's config over queues a, b and c, and a fake executor of one device."""
    (tmp_path / "queues.yaml").write_text(QUEUES)
    config = fast_config(tmp_path / "home", queues_file=tmp_path / "queues.yaml")
    return config, FakeExecutor([NodeInfo("n0", "cpu", 1)])


@contextlib.contextmanager
def _admin_client(config: ServerConfig, fake: FakeExecutor) -> Iterator[TestClient]:
    """A client of a running server over `fake`, with the server's admin token."""
    with TestClient(create_app(config, executor=fake)) as api:
        token = (config.home / "admin.token").read_text().strip()
        api.headers["Authorization"] = f"Bearer {token}"
        yield api


def test_a_restarted_server_remembers_who_held_the_devices(tmp_path: Path) -> None:
    """The decayed use is rebuilt from the store at start: after a restart, queue a (whose
    jobs ran before it) still goes after queue b (which ran nothing), though a submitted
    first; before, the restarted server had forgotten and gave the device to a."""
    config, fake = _one_device(tmp_path)
    with _admin_client(config, fake) as api:
        ran = api.post("/api/v1/jobs", json=job_body("a-old", queue="a")).json()["id"]
        _wait_running(api, fake, 1)
        time.sleep(0.5)  # it holds the device a while
        fake.finish(ran, 0)
        wait_for(api, ran, {"succeeded"})
    fake = FakeExecutor([NodeInfo("n0", "cpu", 1)])
    with _admin_client(config, fake) as api:
        blocker = api.post("/api/v1/jobs", json=job_body("c", queue="c")).json()["id"]
        _wait_running(api, fake, 1)
        first = api.post("/api/v1/jobs", json=job_body("a-new", queue="a")).json()["id"]
        second = api.post("/api/v1/jobs", json=job_body("b-new", queue="b")).json()["id"]
        fake.finish(blocker, 0)
        deadline = time.monotonic() + 30  # a bound on a wait, not a speed check
        while not set(fake.running) & {first, second}:
            assert time.monotonic() < deadline, "nothing started after the blocker"
            time.sleep(0.02)
        assert list(fake.running) == [second]


def test_a_queue_may_hold_only_so_many_services(tmp_path: Path) -> None:
    """Past `max_services_per_queue` a create is a 429 naming the limit, for that queue
    only; a deleted service frees its place."""
    (tmp_path / "queues.yaml").write_text(QUEUES)
    fake, home = FakeExecutor([NodeInfo("n0", "cpu", 4)]), tmp_path / "home"
    config = fast_config(home, queues_file=tmp_path / "queues.yaml", max_services_per_queue=2)
    with TestClient(create_app(config, executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        made = [api.post("/api/v1/services", json={"name": f"s{i}", "queue": "a"}) for i in (0, 1)]
        assert [r.status_code for r in made] == [201, 201], [r.text for r in made]
        refused = api.post("/api/v1/services", json={"name": "s2", "queue": "a"})
        assert refused.status_code == 429, refused.text
        assert "max_services_per_queue: 2" in refused.json()["detail"]
        other = api.post("/api/v1/services", json={"name": "t0", "queue": "b"})
        assert other.status_code == 201, other.text
        api.delete(f"/api/v1/services/{made[0].json()['id']}")
        deadline = time.monotonic() + 30  # a bound on a wait, not a speed check
        while api.post("/api/v1/services", json={"name": "s3", "queue": "a"}).status_code != 201:
            assert time.monotonic() < deadline, "a deleted service still counts"
            time.sleep(0.05)


def test_a_restart_rebuilds_only_the_time_devices_were_held(tmp_path: Path) -> None:
    """A job that ran, was lost, waited queued again (its node cordoned) and ran again held
    the device twice, not for the whole span from its first start to its end: the decayed
    use a restarted server rebuilds is the one the live server counted."""
    config, fake = _one_device(tmp_path)
    with _admin_client(config, fake) as api:
        job = api.post("/api/v1/jobs", json=job_body("a", queue="a", max_restarts=2)).json()["id"]
        _wait_running(api, fake, 1)
        time.sleep(0.3)
        assert api.post("/api/v1/nodes/n0/cordon").status_code == 200
        fake.finish(job, None)  # lost: queued again, and the node takes nothing now
        wait_for(api, job, {"pending"})
        time.sleep(1.5)  # waiting, holding nothing
        assert api.post("/api/v1/nodes/n0/uncordon").status_code == 200
        _wait_running(api, fake, 1)
        time.sleep(0.3)
        fake.finish(job, 0)
        wait_for(api, job, {"succeeded"})
        live = api.app.state.control.scheduling.sched.tree.past_share("a")
    assert live > 0
    with TestClient(create_app(config, executor=FakeExecutor([NodeInfo("n0", "cpu", 1)]))) as api:
        rebuilt = api.app.state.control.scheduling.sched.tree.past_share("a")
    assert rebuilt == pytest.approx(live, rel=0.25), (rebuilt, live)  # not 3x: the wait


KINDS = ["admitted", "running", "preempted", "pending", "attempt_lost", "stopped", "adopted"]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(
    kinds=st.lists(st.sampled_from([*KINDS, "succeeded", "failed", "cancelled"]), max_size=14),
    since=st.integers(0, 16),
)
def test_each_admission_holds_until_the_next_event_that_gives_devices_back(
    tmp_path: Path, kinds: list[str], since: int
) -> None:
    """Over any sequence of a job's events (event i at time i + 1): the holds the store
    reads are the admissions paired with the next release, one still open at the end,
    those that ended before `since` left out; other events change nothing."""
    from argosy.server.store import HOLD_ENDS, Store
    from argosy.server.tables import events

    store = Store(f"sqlite:///{tmp_path / 'holds.db'}")
    row, _ = store.insert_job({"name": "h", "queue": "a", "script": "x.py"}, now=0)
    placement = {"chip": "cpu", "nodes": {"n0": 1}}
    store.update_job(row["id"], {"started_at": 1.0, "placement": placement})
    with store.engine.begin() as c:
        c.execute(events.delete().where(events.c.job_id == row["id"]))
        for i, kind in enumerate(kinds):
            values = {"job_id": row["id"], "kind": kind, "message": "", "created_at": i + 1.0}
            c.execute(events.insert().values(values))
    want, start = [], None
    for i, kind in enumerate(kinds):
        if kind == "admitted" and start is None:
            start = i + 1.0
        elif kind in HOLD_ENDS and start is not None:
            want.append((start, i + 1.0))
            start = None
    if start is not None:
        want.append((start, None))
    want = [(s, e) for s, e in want if e is None or e >= since]
    mine = [h for h in store.holds_since(since) if h["job_id"] == row["id"]]
    assert [(h["start"], h["end"]) for h in mine] == want
    assert all(h["queue"] == "a" and h["placement"] == placement for h in mine)
    store.close()
