"""The health feed: verdicts reported to the server go through the health layer's
node-record policy; a node it cordons or quarantines leaves placement (also across a
server restart) and returns when the policy lets it; `GET /nodes/{name}` shows the
record and the history."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import NODES, STEPS, WORKDIR, app_client

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor


def report(api: TestClient, node: str, verdict: str, detail: str = "") -> dict:
    r = api.post(f"/api/v1/nodes/{node}/health", json={"verdict": verdict, "detail": detail})
    assert r.status_code == 200, r.text
    return r.json()


def placed_on(api: TestClient, fake: FakeExecutor, nproc: int) -> str:
    job = api.post(
        "/api/v1/jobs",
        json={"name": "j", "script": STEPS, "workdir": WORKDIR, "nproc_per_node": nproc},
    )
    job_id = job.json()["id"]
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while job_id not in fake.running:
        assert time.monotonic() < deadline, "the job was not placed"
        time.sleep(0.02)
    return next(iter(fake.running[job_id].nodes))


@pytest.mark.parametrize(
    ("verdicts", "want_state", "want_in_service"),
    [
        (["healthy"], "healthy", True),
        (["degraded"], "healthy", True),
        (["degraded", "straggler"], "cordoned", False),
        (["degraded", "degraded", "healthy", "healthy", "healthy"], "cordoned", False),
        (["failed"], "quarantined", False),
        (["failed", "healthy", "healthy", "healthy"], "quarantined", False),
        (["failed", "repair"], "repaired", True),
        (["failed", "repair", "healthy", "healthy"], "healthy", True),
        (["failed", "repair", "fault", "fault"], "quarantined", False),
    ],
    ids=[
        "healthy",
        "one-degraded",
        "cordoned",
        "cordon-holds-while-the-evidence-is-recent",
        "quarantined",
        "quarantine-needs-repair",
        "repaired",
        "probation-passed",
        "relapse",
    ],
)
def test_verdicts_move_the_node_as_the_policy_says(
    api: TestClient, verdicts: list[str], want_state: str, want_in_service: bool
) -> None:
    for verdict in verdicts:
        node = report(api, "n0", verdict, f"{verdict} seen")
    assert (node["health"], node["in_service"]) == (want_state, want_in_service)
    detail = api.get("/api/v1/nodes/n0").json()
    assert [h["kind"] for h in detail["history"]] == verdicts
    assert detail["history"][-1]["state"] == want_state
    listed = {n["name"]: n["health"] for n in api.get("/api/v1/nodes").json()}
    assert listed == {"n0": want_state, "n1": "healthy"}


def test_an_out_of_service_node_gets_no_new_work_and_returns_after_repair(
    api: TestClient, fake: FakeExecutor
) -> None:
    report(api, "n1", "failed", "gemm x0.31")
    assert placed_on(api, fake, 2) == "n0"
    events = api.get("/api/v1/events").json()["items"]
    assert any(e["kind"] == "node_health" and "quarantined" in e["message"] for e in events)
    report(api, "n1", "repair")
    assert placed_on(api, fake, 2) == "n1"


def test_a_quarantined_node_stays_out_after_a_server_restart(
    home: Path, fake: FakeExecutor
) -> None:
    with app_client(home, fake) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        report(api, "n0", "failed")
    with app_client(home, fake) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        detail = api.get("/api/v1/nodes/n0").json()
        assert detail["health"] == "quarantined" and not detail["in_service"]
        assert placed_on(api, fake, 2) == "n1"
        body = {"name": "k", "script": STEPS, "workdir": WORKDIR, "nproc_per_node": 2}
        second = api.post("/api/v1/jobs", json=body).json()["id"]
        time.sleep(0.5)  # several cycles
        assert api.get(f"/api/v1/jobs/{second}").json()["state"] == "pending"
        assert all("n0" not in r.nodes for r in fake.running.values())


@pytest.mark.parametrize(
    ("node", "body", "token", "want_status"),
    [
        ("nope", {"verdict": "failed"}, "admin", 404),
        ("n0", {"verdict": "sick"}, "admin", 422),
        ("n0", {"verdict": "failed", "colour": "red"}, "admin", 422),
        ("n0", {"verdict": "failed"}, "queue", 403),
        ("n0", {"verdict": "failed"}, "none", 401),
    ],
    ids=["unknown-node", "unknown-verdict", "unknown-key", "queue-token", "no-token"],
)
def test_bad_health_reports_are_refused(
    api: TestClient, node: str, body: dict, token: str, want_status: int
) -> None:
    headers = {}
    if token == "queue":
        made = api.post("/api/v1/tokens", json={"queue": "default"}).json()["token"]
        headers = {"Authorization": f"Bearer {made}"}
    elif token == "none":
        headers = {"Authorization": ""}
    r = api.post(f"/api/v1/nodes/{node}/health", json=body, headers=headers)
    assert r.status_code == want_status, r.text
    assert api.get("/api/v1/nodes/n0").json()["health"] == "healthy"


def _finish_with_node_health(api: TestClient, fake: FakeExecutor, text: str) -> tuple[str, str]:
    """Place a job, write `text` as its run's node_health.json, end it with exit code 1."""
    job_id = api.post(
        "/api/v1/jobs", json={"name": "r", "script": STEPS, "workdir": WORKDIR, "max_restarts": 0}
    )
    job_id = job_id.json()["id"]
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while job_id not in fake.running:
        assert time.monotonic() < deadline, "the job was not placed"
        time.sleep(0.02)
    request = fake.running[job_id]
    request.run_dir.mkdir(parents=True, exist_ok=True)
    (request.run_dir / "node_health.json").write_text(text)
    fake.finish(job_id, 1)
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while api.get(f"/api/v1/jobs/{job_id}").json()["state"] != "failed":
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.02)
    return job_id, next(iter(request.nodes))


def test_a_runs_crashes_count_against_the_node_it_ran_on(
    api: TestClient, fake: FakeExecutor
) -> None:
    now = time.time()
    evidence = [{"kind": "fault", "at_s": now - 3 + i, "detail": f"crash {i}"} for i in range(3)]
    _, node = _finish_with_node_health(api, fake, json.dumps({"evidence": evidence}))
    detail = api.get(f"/api/v1/nodes/{node}").json()
    assert [h["kind"] for h in detail["history"]] == ["run fault"]  # one entry an attempt
    assert detail["score"] > 0 and detail["in_service"]  # one attempt alone cordons nothing


def test_a_fault_the_run_injected_itself_does_not_count_against_the_node(
    api: TestClient, fake: FakeExecutor
) -> None:
    """`inject: [kill:rank=1:step=30]` is the user's test, not the node's failing: the
    launcher marks such evidence `injected`, and the node's record does not take it."""
    now = time.time()
    injected = [{"kind": "fault", "at_s": now, "detail": "killed", "injected": True}] * 3
    real = [{"kind": "fault", "at_s": now, "detail": "crash", "injected": "no"}]
    _, node = _finish_with_node_health(api, fake, json.dumps({"evidence": injected + real}))
    detail = api.get(f"/api/v1/nodes/{node}").json()
    assert [h["detail"].split(" (")[0] for h in detail["history"]] == ["crash"]
    assert detail["in_service"]


@pytest.mark.parametrize("text", ["", "{not json", "[]", '{"evidence": [{"kind": "odd"}]}'])
def test_an_unreadable_node_health_file_changes_nothing(
    api: TestClient, fake: FakeExecutor, text: str
) -> None:
    _, node = _finish_with_node_health(api, fake, text)
    detail = api.get(f"/api/v1/nodes/{node}").json()
    assert detail["history"] == [] and detail["in_service"]


def _gang_histories(
    api: TestClient,
    fake: FakeExecutor,
    kinds: tuple[list[str], list[str]],
    lost: tuple[int, ...] = (),
) -> tuple[list[str], list[str]]:
    """Run a 2-node gang (both nodes whole) whose node ranks 0 and 1 write evidence of
    `kinds` in their own `node_health.json`, end it failed having lost the node ranks
    `lost`; the history kinds of the placement's first and second node."""
    body = {"name": "g", "script": STEPS, "workdir": WORKDIR, "max_restarts": 0}
    body |= {"nnodes": 2, "nproc_per_node": 2}
    job_id = api.post("/api/v1/jobs", json=body).json()["id"]
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while job_id not in fake.running:
        assert time.monotonic() < deadline, "the gang was not placed"
        time.sleep(0.02)
    request = fake.running[job_id]
    now = time.time()
    for where, found in zip((request.run_dir, request.run_dir / "node1"), kinds, strict=True):
        where.mkdir(parents=True, exist_ok=True)
        evidence = [{"kind": k, "at_s": now + i, "detail": f"{k} {i}"} for i, k in enumerate(found)]
        (where / "node_health.json").write_text(json.dumps({"evidence": evidence}))
    fake.finish(job_id, 1, lost_node_ranks=lost)
    while api.get(f"/api/v1/jobs/{job_id}").json()["state"] != "failed":
        assert time.monotonic() < deadline, "the gang did not end"
        time.sleep(0.02)
    first, second = (api.get(f"/api/v1/nodes/{n}").json()["history"] for n in request.nodes)
    return [h["kind"] for h in first], [h["kind"] for h in second]


def test_each_node_rank_s_evidence_counts_against_its_own_node(
    api: TestClient, fake: FakeExecutor
) -> None:
    """A 2-node gang: node rank 1 writes `node1/node_health.json`; its crashes count
    against the placement's second node only, node rank 0's against the first."""
    first, second = _gang_histories(api, fake, (["fault"], ["fault"] * 3))
    assert first == ["run fault"] and second == ["run fault"]  # one entry an attempt


@pytest.mark.parametrize("lost", [(), (1,)])
def test_a_survivor_s_crashes_after_its_peer_node_was_lost_do_not_count_against_it(
    api: TestClient, fake: FakeExecutor, lost: tuple[int, ...]
) -> None:
    """A 2-node gang whose node rank 1 was lost: node rank 0's crash and hang followed from
    the lost peer (its collective failed or stalled) and do not count against its node;
    its straggler verdict, its own, does. Without a lost node rank, all of it counts."""
    kinds = (["fault", "fault", "straggler"], ["fault"])
    survivor, peer = _gang_histories(api, fake, kinds, lost)
    assert survivor == (["run straggler"] if lost else ["run fault"])  # one entry an attempt
    assert peer == ["run fault"]  # the lost node's own word


def test_a_lost_node_is_recorded_in_its_health_and_placeable_again_when_back(
    api: TestClient, fake: FakeExecutor
) -> None:
    lost = fake.nodes.pop()
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while not api.get(f"/api/v1/nodes/{lost.name}").json()["history"]:
        assert time.monotonic() < deadline, "the loss was not recorded"
        time.sleep(0.02)
    detail = api.get(f"/api/v1/nodes/{lost.name}").json()
    assert detail["history"][0]["kind"] == "fault" and "lost" in detail["history"][0]["detail"]
    fake.nodes.append(lost)
    assert placed_on(api, fake, 2) in {"n0", "n1"}
    while not api.get(f"/api/v1/nodes/{lost.name}").json()["in_service"]:
        assert time.monotonic() < deadline, "the node did not come back into service"
        time.sleep(0.02)


@pytest.mark.parametrize("exact", [True, False])
def test_a_gang_asking_more_nodes_than_exist_is_refused_at_submit(
    api: TestClient, exact: bool
) -> None:
    body = {"name": "big", "script": STEPS, "workdir": WORKDIR, "nnodes": 3, "nproc_per_node": 2}
    r = api.post("/api/v1/jobs", json=body | {"exact_nodes": exact})
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "nnodes"]
    if exact:  # the nodes a gang could have had
        assert "needs 3 node(s) with 2 device(s) each in one node group" in error["msg"]
        assert "at most 2 such node(s)" in error["msg"]
    else:  # packed: the devices it needs in one group
        assert "needs 6 devices on at most 3 node(s) of at least 2" in error["msg"]
        assert "the most such a group holds is 4 device(s)" in error["msg"]
    assert "big" not in api.get("/api/v1/jobs", params={"name": "big"}).text


def test_a_pending_job_says_why_it_waits_in_the_api(api: TestClient) -> None:
    """Both nodes cordoned: the job waits, and `GET /jobs/{id}` (so `argosy job`) says why,
    as the console's queues page does; a job that is not pending has no such line."""
    for node in NODES:
        assert api.post(f"/api/v1/nodes/{node.name}/cordon").status_code == 200
    body = {"name": "w", "script": STEPS, "workdir": WORKDIR}
    job_id = api.post("/api/v1/jobs", json=body).json()["id"]
    job = api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "pending" and job["waiting"], job
    assert "cordon" in job["waiting"] or "out of" in job["waiting"], job["waiting"]
    listed = api.get("/api/v1/jobs").json()
    rows = listed["items"] if isinstance(listed, dict) else listed
    assert all(r.get("waiting") is None for r in rows)


@pytest.mark.parametrize(("exact", "out_by"), [(True, "hand"), (True, "health"), (False, "hand")])
def test_a_gang_with_free_devices_but_no_place_says_so(home: Path, exact: bool, out_by: str):
    """Enough devices are free in all (1 + 8), but a gang of 2 nodes x 1 needs two nodes
    of one group (one chip, one node size) and the other 1-device node is cordoned (by
    hand, or by its health record after a failed check): the job says it has no place,
    why, and what brings the node back, not "fits now". Brought back, it starts."""
    fake = FakeExecutor([NodeInfo("head", "cpu", 1), NodeInfo("w1", "cpu", 1),
                         NodeInfo("big", "cpu", 8)])  # fmt: skip
    with app_client(home, fake) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        if out_by == "hand":
            assert api.post("/api/v1/nodes/w1/cordon").status_code == 200
        else:
            failed = {"verdict": "failed", "detail": "GEMM check failed"}
            assert api.post("/api/v1/nodes/w1/health", json=failed).status_code == 200
        body = {"name": "g", "script": STEPS, "workdir": WORKDIR, "nnodes": 2}
        job_id = api.post("/api/v1/jobs", json=body | {"exact_nodes": exact}).json()["id"]
        time.sleep(0.5)  # scheduling cycles pass
        job = api.get(f"/api/v1/jobs/{job_id}").json()
        if not exact:  # packed: 2 devices of the 8-device node hold it
            assert job["state"] == "running" and job["placement"]["nodes"] == {"big": 2}
            return
        assert job["state"] == "pending", job
        assert "fits now" not in job["waiting"], job["waiting"]
        assert "needs 2 node(s) with 1 free device(s) each" in job["waiting"]
        assert "head 1 of 1" in job["waiting"]
        if out_by == "hand":
            assert "w1 (cordoned; `argosy cordon w1 --undo` brings it back)" in job["waiting"]
            assert api.post("/api/v1/nodes/w1/uncordon").status_code == 200
        else:
            assert "w1 (health: " in job["waiting"], job["waiting"]
            assert "`argosy repair w1` brings it back)" in job["waiting"]
            repair = {"verdict": "repair", "detail": "replaced"}
            assert api.post("/api/v1/nodes/w1/health", json=repair).status_code == 200
        deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
        while job_id not in fake.running:
            assert time.monotonic() < deadline, "the gang was not placed once w1 came back"
            time.sleep(0.02)
