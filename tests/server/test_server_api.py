"""The REST API end to end on a real store and the local executor (FastAPI TestClient)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import STEPS, TERMINAL, fast_config, job_body, wait_for

pytestmark = pytest.mark.integration

WANT_JOB_KEYS = {"id", "name", "queue", "state", "attempts", "created_at"}


def test_health_needs_no_token(client: TestClient) -> None:
    r = client.get("/api/v1/health", headers={"Authorization": ""})
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/jobs"),
        ("POST", "/api/v1/jobs"),
        ("GET", "/api/v1/nodes"),
        ("GET", "/metrics"),
        ("POST", "/api/v1/tokens"),
    ],
    ids=["list", "submit", "nodes", "metrics", "tokens"],
)
def test_calls_without_a_valid_token_are_401(client: TestClient, method: str, path: str) -> None:
    for header in ("", "Bearer nope", "Basic abc"):
        r = client.request(method, path, headers={"Authorization": header}, json=job_body())
        assert r.status_code == 401, (header, r.text)


def test_a_job_runs_to_success_through_argosy_launch(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json=job_body("ok"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert set(job) >= WANT_JOB_KEYS
    assert job["state"] == "pending" and job["attempts"] == 0 and job["queue"] == "default"
    done = wait_for(client, job["id"], TERMINAL)
    assert done["state"] == "succeeded", done
    assert done["attempts"] == 1 and done["exit_code"] == 0
    assert done["placement"]["chip"] == "cpu"
    assert done["summary"]["status"] == "completed"  # the runtime's summary.json
    kinds = [e["kind"] for e in client.get(f"/api/v1/jobs/{job['id']}/events").json()["items"]]
    assert kinds == ["submitted", "admitted", "running", "succeeded"]
    logs = client.get(f"/api/v1/jobs/{job['id']}/logs")
    assert "step 2" in logs.text and int(logs.headers["x-next-offset"]) == len(logs.content)


def test_a_failing_job_fails_with_the_runtimes_cause(client: TestClient) -> None:
    body = job_body("bad", args=["--fail"], max_restarts=0)
    job = client.post("/api/v1/jobs", json=body).json()
    done = wait_for(client, job["id"], TERMINAL)
    assert done["state"] == "failed" and done["exit_code"] == 1
    assert "attempt 1" in done["reason"]


def test_queue_tokens_may_change_only_their_queue(client: TestClient, tmp_path: Path) -> None:
    r = client.post("/api/v1/tokens", json={"queue": "nowhere"})
    assert r.status_code == 422 and "default" in _messages(r)
    token = client.post("/api/v1/tokens", json={"queue": "default"}).json()["token"]
    user = {"Authorization": f"Bearer {token}"}
    assert (
        client.post("/api/v1/jobs", json=job_body(queue="other"), headers=user).status_code == 403
    )
    assert client.post("/api/v1/tokens", json={}, headers=user).status_code == 403
    assert client.post("/api/v1/nodes/x/cordon", headers=user).status_code == 403
    job = client.post("/api/v1/jobs", json=job_body(), headers=user)
    assert job.status_code == 201
    assert client.get(f"/api/v1/jobs/{job.json()['id']}", headers=user).status_code == 200


def test_a_queue_token_cannot_cancel_in_another_queue(home: Path, tmp_path: Path) -> None:

    from argosy.server.app import create_app

    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: org\n    children:\n      - name: a\n      - name: b\n")
    with TestClient(create_app(fast_config(home, queues_file=queues))) as c:
        admin = {"Authorization": "Bearer " + (home / "admin.token").read_text().strip()}
        tok_a = c.post("/api/v1/tokens", json={"queue": "a"}, headers=admin).json()["token"]
        body = job_body(queue="b", args=["--steps", "50", "--step-s", "0.1"])
        job_b = c.post("/api/v1/jobs", json=body, headers=admin).json()
        r = c.post(
            f"/api/v1/jobs/{job_b['id']}/cancel", headers={"Authorization": f"Bearer {tok_a}"}
        )
        assert r.status_code == 403
        tok_b = c.post("/api/v1/tokens", json={"queue": "b"}, headers=admin).json()["token"]
        logs = f"/api/v1/jobs/{job_b['id']}/logs"
        for rank in ("0", "launcher"):  # a tenant's output is its own (and the admins')
            r = c.get(logs, params={"rank": rank}, headers={"Authorization": f"Bearer {tok_a}"})
            assert r.status_code == 403 and "queue 'b'" in r.json()["detail"]
            r = c.get(logs, params={"rank": rank}, headers={"Authorization": f"Bearer {tok_b}"})
            assert r.status_code == 200
            assert c.get(logs, params={"rank": rank}, headers=admin).status_code == 200
        assert c.post(f"/api/v1/jobs/{job_b['id']}/cancel", headers=admin).status_code == 200
        c.headers.update(admin)
        assert wait_for(c, job_b["id"], TERMINAL)["state"] == "cancelled"


def test_unknown_queue_and_impossible_size_are_422_with_the_reason(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json=job_body(queue="defualt"))
    assert r.status_code == 422 and "known: default" in _messages(r)
    r = client.post("/api/v1/jobs", json=job_body(nproc_per_node=64))
    assert r.status_code == 422 and "64 device(s)" in _messages(r)
    r = client.post("/api/v1/jobs", json=job_body(nproc_per_node=0))
    assert r.status_code == 422
    r = client.post("/api/v1/jobs", json=job_body(colour="red"))
    assert r.status_code == 422


def test_idempotency_key_returns_the_first_job(client: TestClient) -> None:
    key = {"Idempotency-Key": "k-1"}
    first = client.post("/api/v1/jobs", json=job_body("idem"), headers=key)
    again = client.post("/api/v1/jobs", json=job_body("idem"), headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = client.post("/api/v1/jobs", json=job_body("other"), headers=key)
    assert other.status_code == 409
    assert len(client.get("/api/v1/jobs", params={"name": "idem"}).json()["items"]) == 1


def test_idempotency_keys_are_each_tokens_own(client: TestClient) -> None:
    """Two tokens of one queue sending the same key and body get a job each; each token's
    retry gets its own job back; a different body under another token's key is no 409."""
    users = [
        {
            "Authorization": "Bearer "
            + client.post("/api/v1/tokens", json={"queue": "default"}).json()["token"]
        }
        for _ in range(2)
    ]
    key = {"Idempotency-Key": "nightly"}
    first = [client.post("/api/v1/jobs", json=job_body("idem"), headers=u | key) for u in users]
    assert [r.status_code for r in first] == [201, 201]
    assert first[0].json()["id"] != first[1].json()["id"]
    again = client.post("/api/v1/jobs", json=job_body("idem"), headers=users[1] | key)
    assert again.status_code == 200 and again.json()["id"] == first[1].json()["id"]
    other = client.post("/api/v1/jobs", json=job_body("other"), headers=key)  # the admin
    assert other.status_code == 201


def test_pagination_and_filters_see_every_job_once(client: TestClient) -> None:
    client.post("/api/v1/nodes/" + client.get("/api/v1/nodes").json()[0]["name"] + "/cordon")
    ids = [client.post("/api/v1/jobs", json=job_body(f"p{i % 2}")).json()["id"] for i in range(7)]
    seen, cursor = [], 0
    while True:
        page = client.get("/api/v1/jobs", params={"limit": 3, "cursor": cursor}).json()
        seen += [j["id"] for j in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == ids
    p1 = client.get("/api/v1/jobs", params={"name": "p1", "state": "pending"}).json()["items"]
    assert [j["id"] for j in p1] == ids[1::2]
    assert client.get("/api/v1/jobs", params={"state": "running"}).json()["items"] == []
    assert client.get("/api/v1/jobs", params={"state": "bogus"}).status_code == 422


def test_cordon_keeps_new_work_off_and_uncordon_lets_it_start(client: TestClient) -> None:
    node = client.get("/api/v1/nodes").json()[0]["name"]
    assert client.post(f"/api/v1/nodes/{node}/cordon").json()["cordoned"] is True
    assert client.post("/api/v1/nodes/nope/cordon").status_code == 404
    job = client.post("/api/v1/jobs", json=job_body("c")).json()
    wait_for(client, job["id"], {"pending"})
    import time

    time.sleep(0.5)  # several cycles
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "pending"
    assert client.post(f"/api/v1/nodes/{node}/uncordon").json()["cordoned"] is False
    assert wait_for(client, job["id"], TERMINAL)["state"] == "succeeded"


def test_cancel_pending_and_running_jobs(client: TestClient) -> None:
    long = job_body("long", args=["--steps", "200", "--step-s", "0.05"], nproc_per_node=2)
    running = client.post("/api/v1/jobs", json=long).json()
    queued = client.post("/api/v1/jobs", json=long).json()  # the node has 2 slots
    wait_for(client, running["id"], {"running"})
    assert client.post(f"/api/v1/jobs/{queued['id']}/cancel").json()["state"] == "cancelled"
    client.post(f"/api/v1/jobs/{running['id']}/cancel")
    done = wait_for(client, running["id"], TERMINAL)
    assert done["state"] == "cancelled"
    assert client.post("/api/v1/jobs/jnope/cancel").status_code == 404


def test_queues_nodes_and_metrics_report_the_cluster(client: TestClient) -> None:
    queues = client.get("/api/v1/queues").json()
    assert [q["name"] for q in queues] == ["default"]
    assert queues[0]["nominal"] == {"cpu": 2}
    nodes = client.get("/api/v1/nodes").json()
    assert nodes[0]["devices"] == 2 and nodes[0]["chip"] == "cpu"
    job = client.post("/api/v1/jobs", json=job_body("m")).json()
    wait_for(client, job["id"], TERMINAL)
    text = client.get("/metrics").text
    assert 'argosy_jobs{queue="default",state="succeeded"} 1.0' in text
    assert 'argosy_devices{chip="cpu"} 2.0' in text
    assert "argosy_queue_pending_jobs" in text and "argosy_effective_training_time" in text


def test_openapi_schema_is_served(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "/api/v1/jobs" in schema["paths"] and "/api/v1/health" in schema["paths"]
    assert client.get("/docs").status_code == 200


def test_relative_script_resolves_against_workdir(client: TestClient, tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "s.py").write_text(Path(STEPS).read_text())
    job = client.post(
        "/api/v1/jobs", json=job_body("rel", script="s.py", workdir=str(tmp_path / "w"))
    ).json()
    assert wait_for(client, job["id"], TERMINAL)["state"] == "succeeded"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/jobs", job_body("q", queue="no-such-queue"), "queue"),
        ("/api/v1/jobs", job_body("n", nnodes=99), "nnodes"),
        ("/api/v1/jobs", job_body("c", chips=["no-such-chip"]), "chips"),
        ("/api/v1/jobs", job_body("e", elastic={"min_nnodes": 90, "max_nnodes": 99}), "elastic"),
        ("/api/v1/tokens", {"queue": "no-such-queue"}, "queue"),
    ],
    ids=["unknown-queue", "too-many-nodes", "unknown-chip", "elastic-too-big", "token-queue"],
)
def test_every_refusal_is_a_list_of_field_errors(
    client: TestClient, path: str, body: dict, field: str
) -> None:
    """One 422 shape whether the body is malformed or names what the server cannot run."""
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"][:2] == ["body", field] and error["msg"], error


def _messages(r) -> str:  # noqa: ANN001
    """The messages of a 422's field errors, joined."""
    return "; ".join(e["msg"] for e in r.json()["detail"])
