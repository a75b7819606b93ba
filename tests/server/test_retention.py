"""The store keeps ended jobs and services per queue, the newest by end: the removal is
checked against a plain model of the policy over random stores, and end to end through
the API of a real server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.server.retention import (
    BATCH,
    PAST_USE_HALF_LIVES,
    Retention,
    RetentionPolicy,
    ended_to_remove,
)
from argosy.server.store import Store

NOW = 1_000_000.0
DAY = 86_400.0
HALF_LIFE = DAY
QUEUES = ("a", "b", "c")
STATES = ("pending", "running", "succeeded", "failed", "cancelled")
ENDED = {"succeeded", "failed", "cancelled"}

job_st = st.fixed_dictionaries(
    {
        "queue": st.sampled_from(QUEUES),
        "state": st.sampled_from(STATES),
        "age_days": st.floats(0, 12, allow_nan=False),
        "held": st.booleans(),
    }
)
service_st = st.fixed_dictionaries(
    {"queue": st.sampled_from(QUEUES), "state": st.sampled_from(("running", "deleted", "failed"))}
)


def _fill(store: Store, specs: list[dict]) -> list[dict]:
    """Jobs as `specs` say, each with a second event; their rows as stored."""
    rows = []
    for i, s in enumerate(specs):
        spec = {"name": f"j{i}", "queue": s["queue"]}
        row, _ = store.insert_job(spec, now=NOW - 20 * DAY)
        ended_at = NOW - s["age_days"] * DAY
        values: dict = {"state": s["state"]}
        if s["held"] and s["state"] != "pending":
            values["started_at"] = ended_at - 10
        if s["state"] in ENDED:
            values["finished_at"] = ended_at
        store.update_job(row["id"], values, event=("noted", "by the test"))
        rows.append(store.get_job(row["id"]) | {"ended_at": ended_at})
    return rows


def _expected(rows: list[dict], policy: RetentionPolicy) -> set[str]:
    """The policy as the docstring states it, over plain Python rows."""
    held_before = NOW - PAST_USE_HALF_LIVES * policy.half_life_s
    out = set()
    for q in QUEUES:
        ended = [r for r in rows if r["queue"] == q and r["state"] in ENDED]
        ended.sort(key=lambda r: (r["ended_at"], r["seq"]), reverse=True)
        for rank, r in enumerate(ended, 1):
            past = (policy.keep_per_queue > 0 and rank > policy.keep_per_queue) or (
                policy.keep_days > 0 and r["ended_at"] < NOW - policy.keep_days * DAY
            )
            if past and (r["started_at"] is None or r["ended_at"] < held_before):
                out.add(r["id"])
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(job_st, max_size=30),
    services=st.lists(service_st, max_size=8),
    keep=st.integers(0, 6),
    keep_days=st.sampled_from([0.0, 1.0, 6.0]),
)
def test_what_is_removed_is_what_the_policy_says_and_nothing_active(
    tmp_path_factory: pytest.TempPathFactory,
    specs: list[dict],
    services: list[dict],
    keep: int,
    keep_days: float,
) -> None:
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('db') / 'a.db'}")
    try:
        rows = _fill(store, specs)
        service_rows = []
        for i, s in enumerate(services):
            svc = store.insert_service({"name": f"s{i}", "queue": s["queue"]}, now=NOW)
            store.update_service(svc["id"], {"state": s["state"]})
            service_rows.append(svc | {"state": s["state"]})
        policy = RetentionPolicy(keep, keep_days, HALF_LIFE)
        retention = Retention(store, policy, lambda: NOW)
        retention.choose()
        retention.apply()
        left = {r["id"] for r in store.list_jobs(limit=1000)[0]}
        removed = {r["id"] for r in rows} - left
        assert removed == (_expected(rows, policy) if policy.on else set())
        for r in rows:  # a removed job's events go with it; a kept one keeps them all
            events = store.list_events(job_id=r["id"], limit=10)[0]
            assert len(events) == (0 if r["id"] in removed else 2)
        kept = {s["id"] for s in store.list_services(limit=1000)[0]}
        gone = {s["id"] for s in service_rows} - kept
        assert gone == _expected_services(service_rows, policy)
    finally:
        store.close()


def _expected_services(rows: list[dict], policy: RetentionPolicy) -> set[str]:
    """Ended services past the newest `keep_per_queue` of their queue (all of them ended
    just now, by the store's clock: no age limit reaches them)."""
    out = set()
    for q in QUEUES:
        ended = [r for r in rows if r["queue"] == q and r["state"] != "running"]
        out |= (
            {r["id"] for r in ended[::-1][policy.keep_per_queue :]}
            if policy.keep_per_queue
            else set()
        )
    return out


def test_a_pass_removes_at_most_a_batch_the_oldest_first(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        specs = [
            {"queue": "a", "state": "cancelled", "age_days": i / 1000, "held": False}
            for i in range(BATCH + 20)
        ]
        rows = _fill(store, specs)
        chosen = ended_to_remove(store.engine, RetentionPolicy(10, 0.0, HALF_LIFE), NOW)
        assert len(chosen.jobs) == BATCH
        oldest = sorted(rows, key=lambda r: r["ended_at"])[:BATCH]
        assert chosen.jobs == [r["id"] for r in oldest]
    finally:
        store.close()


def test_a_job_that_held_devices_stays_until_its_use_decayed(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        young = {"queue": "a", "state": "succeeded", "age_days": 1.0, "held": True}
        old = young | {"age_days": PAST_USE_HALF_LIVES + 1.0}
        flood = [young | {"age_days": 0.5, "held": False}] * 3
        rows = _fill(store, [young, old, *flood])
        policy = RetentionPolicy(1, 0.0, HALF_LIFE)
        removed = set(ended_to_remove(store.engine, policy, NOW).jobs)
        assert rows[0]["id"] not in removed  # held a day ago: fair share still counts it
        assert rows[1]["id"] in removed
        assert removed == {r["id"] for r in rows[1:4]}  # the newest of the flood is kept
    finally:
        store.close()


def test_a_server_keeps_the_newest_ended_jobs_of_each_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from argosy.executors.base import NodeInfo
    from argosy.executors.fake import FakeExecutor
    from argosy.server import control
    from argosy.server.app import create_app
    from argosy.server.config import ServerConfig

    monkeypatch.setattr(control, "RETENTION_EVERY_S", 0.0)
    config = ServerConfig(home=tmp_path / "home", cycle_interval_s=0.05, keep_finished_per_queue=2)
    script = str(Path(__file__).parent / "scripts" / "steps.py")
    with TestClient(create_app(config, FakeExecutor([NodeInfo("n0", "cpu", 1)]))) as client:
        client.headers["Authorization"] = f"Bearer {(config.home / 'admin.token').read_text()}"
        assert client.post("/api/v1/nodes/n0/cordon").status_code == 200  # nothing starts
        ids = []
        for i in range(5):
            body = {"name": f"j{i}", "script": script, "workdir": "/"}
            job = client.post("/api/v1/jobs", json=body).json()
            assert client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
            ids.append(job["id"])
            time.sleep(0.01)
        deadline = time.monotonic() + 20
        while len(client.get("/api/v1/jobs").json()["items"]) > 2:
            assert time.monotonic() < deadline, "retention never removed the oldest jobs"
            time.sleep(0.05)
        assert [j["id"] for j in client.get("/api/v1/jobs").json()["items"]] == ids[-2:]
        assert client.get(f"/api/v1/jobs/{ids[0]}").status_code == 404
        assert client.get(f"/api/v1/jobs/{ids[0]}/events").status_code == 404


def _deep_tree(top: Path, levels: int) -> None:
    """`top` with `levels` nested folders in it (made by descriptor: no path that long)."""
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


def _run(retention: Retention) -> None:
    """One pass, its parts run as `Control.step` runs them."""
    for part in retention.parts():
        if part is not None:
            part()


def test_one_pass_removes_a_flood_batch_after_batch_with_its_run_dirs(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        specs = [{"queue": "a", "state": "cancelled", "age_days": 0.0, "held": False}]
        rows = _fill(store, specs * (2 * BATCH + 10))
        runs = tmp_path / "runs"
        deep = runs / rows[0]["id"]
        _deep_tree(deep, 3000)  # past Python's recursion limit
        (runs / rows[-1]["id"]).mkdir()  # kept: the newest
        policy = RetentionPolicy(5, 0.0, HALF_LIFE)
        _run(Retention(store, policy, lambda: NOW, lambda job_id: runs / job_id))
        left = [r["id"] for r in store.list_jobs(limit=10_000)[0]]
        assert len(left) == 5
        assert not deep.exists() and (runs / rows[-1]["id"]).exists()
    finally:
        store.close()


def test_a_removed_service_takes_its_replicas_run_dirs(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    runs = tmp_path / "runs"
    try:
        ids = []
        for i in range(3):
            svc = store.insert_service({"name": f"s{i}", "queue": "a"}, now=NOW)
            store.update_service(svc["id"], {"state": "deleted" if i < 2 else "running"})
            (runs / svc["id"] / "r0" / "logs").mkdir(parents=True)
            ids.append(svc["id"])
        policy = RetentionPolicy(1, 0.0, HALF_LIFE)
        _run(Retention(store, policy, lambda: NOW, lambda key: runs / key))
        kept = {s["id"] for s in store.list_services(limit=10)[0]}
        assert kept == {ids[1], ids[2]}  # the newest ended one, and the running one
        assert [p.name for p in sorted(runs.iterdir())] == sorted(kept)
    finally:
        store.close()


def test_an_active_job_chosen_by_mistake_keeps_its_row_and_events(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        running, ended = _fill(
            store,
            [
                {"queue": "a", "state": "running", "age_days": 1.0, "held": True},
                {"queue": "a", "state": "failed", "age_days": 1.0, "held": False},
            ],
        )
        assert store.remove_ended([running["id"], ended["id"]], []) == [ended["id"]]
        assert store.get_job(running["id"]) is not None and store.get_job(ended["id"]) is None
        assert len(store.list_events(job_id=running["id"])[0]) == 2
    finally:
        store.close()
