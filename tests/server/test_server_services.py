"""Services through the API and the control loop: placement by the scheduler, restarts,
failure after `max_restarts`, delete, adoption after a server restart, bad input. The
fake executor stands in for processes here; `test_server_services_real.py` runs the real
`argosy serve`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import NODES, STEPS, WORKDIR, fast_config

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app


def wait_until(api: TestClient, service_id: str, check, timeout_s: float = 10.0) -> dict:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while True:
        data = api.get(f"/api/v1/services/{service_id}").json()
        if check(data) or time.monotonic() > deadline:
            assert check(data), data
            return data
        time.sleep(0.02)


def replicas_running(fake: FakeExecutor, service_id: str) -> dict[str, int]:
    return {k: r.attempt for k, r in fake.running.items() if k.startswith(service_id)}


def test_replicas_are_placed_one_device_each_and_started_as_argosy_serve(
    api: TestClient, fake: FakeExecutor
) -> None:
    body = {"name": "chat", "replicas": 3, "model": "smollm2-135m", "port": 9100}
    created = api.post("/api/v1/services", json=body)
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    data = wait_until(api, sid, lambda s: len(s["replicas"]) == 3)
    assert data["state"] == "starting"  # no replica answers a health probe here
    requests = [fake.running[f"{sid}.r{i}"] for i in range(3)]
    assert [r.command[3:6] for r in requests] == [("serve", "--model", "smollm2-135m")] * 3
    ports = sorted(int(r.command[r.command.index("--port") + 1]) for r in requests)
    assert ports == [9100, 9101, 9102]
    used = {n["name"]: n["devices"] - n["free"] for n in api.get("/api/v1/nodes").json()}
    assert sum(used.values()) == 3 and max(used.values()) <= 2
    listed = api.get("/api/v1/services", params={"state": "starting"}).json()["items"]
    assert [s["id"] for s in listed] == [sid]


def test_an_exited_replica_restarts_until_max_restarts_then_the_service_fails(
    api: TestClient, fake: FakeExecutor
) -> None:
    sid = api.post("/api/v1/services", json={"name": "s", "replicas": 2, "max_restarts": 1})
    sid = sid.json()["id"]
    wait_until(api, sid, lambda s: len(s["replicas"]) == 2)
    fake.finish(f"{sid}.r0", 1)
    data = wait_until(api, sid, lambda s: s["replicas"][0]["attempt"] == 2)
    assert data["replicas"][0]["restarts"] == 1 and replicas_running(fake, sid)[f"{sid}.r0"] == 2
    fake.finish(f"{sid}.r0", 137)
    data = wait_until(api, sid, lambda s: s["state"] == "failed")
    assert "max_restarts=1 used up" in data["reason"]
    assert replicas_running(fake, sid) == {}  # the healthy replica was stopped too
    assert all(n["free"] == n["devices"] for n in api.get("/api/v1/nodes").json())
    kinds = [e["kind"] for e in api.get(f"/api/v1/services/{sid}/events").json()["items"]]
    assert kinds.count("replica_started") == 3 and kinds[-1] == "failed"


def test_delete_stops_the_replicas_and_frees_their_devices(
    api: TestClient, fake: FakeExecutor
) -> None:
    sid = api.post("/api/v1/services", json={"name": "s", "replicas": 4}).json()["id"]
    wait_until(api, sid, lambda s: len(s["replicas"]) == 4)
    assert all(n["free"] == 0 for n in api.get("/api/v1/nodes").json())
    assert api.delete(f"/api/v1/services/{sid}").json()["state"] in ("stopping", "deleted")
    data = wait_until(api, sid, lambda s: s["state"] == "deleted")
    assert {r["state"] for r in data["replicas"]} == {"exited"}
    assert replicas_running(fake, sid) == {}
    assert all(n["free"] == 2 and n["jobs"] == [] for n in api.get("/api/v1/nodes").json())
    job = api.post(
        "/api/v1/jobs", json={"name": "j", "script": STEPS, "workdir": WORKDIR, "nproc_per_node": 2}
    )
    assert job.status_code == 201
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while api.get(f"/api/v1/jobs/{job.json()['id']}").json()["state"] != "running":
        assert time.monotonic() < deadline, "the job did not get the freed devices"
        time.sleep(0.02)


def test_a_restarted_server_adopts_replicas_that_still_run(home: Path, fake: FakeExecutor) -> None:
    with TestClient(create_app(fast_config(home), executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        sid = api.post("/api/v1/services", json={"name": "s", "replicas": 2}).json()["id"]
        wait_until(api, sid, lambda s: len(s["replicas"]) == 2)
    fake.finish(f"{sid}.r1", None)  # one replica died while no server was up
    with TestClient(create_app(fast_config(home), executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        data = wait_until(api, sid, lambda s: s["replicas"][1]["attempt"] == 2)
        assert data["replicas"][0]["attempt"] == 1  # adopted, never started twice
        assert replicas_running(fake, sid) == {f"{sid}.r0": 1, f"{sid}.r1": 2}


@pytest.mark.parametrize(
    ("body", "want_status", "want_text"),
    [
        ({"name": "s", "replicas": 5}, 422, "needs 5 devices"),
        ({"name": "s", "queue": "nope"}, 422, "known: default"),
        ({"name": "s", "chips": ["h100"]}, 422, "cluster has"),
        ({"name": "s", "replicas": 0}, 422, "replicas"),
        ({"name": "s", "colour": "red"}, 422, "colour"),
    ],
    ids=["too-many-replicas", "unknown-queue", "missing-chip", "zero-replicas", "unknown-key"],
)
def test_bad_services_are_refused_with_the_reason(
    api: TestClient, body: dict, want_status: int, want_text: str
) -> None:
    r = api.post("/api/v1/services", json=body)
    assert r.status_code == want_status and want_text in r.text, r.text


def test_queue_tokens_may_not_touch_other_queues_and_unknown_ids_are_404(api: TestClient) -> None:
    sid = api.post("/api/v1/services", json={"name": "s"}).json()["id"]
    token = api.post("/api/v1/tokens", json={"queue": "default", "name": "u"}).json()["token"]
    stranger = {"Authorization": "Bearer x"}
    assert api.delete(f"/api/v1/services/{sid}", headers=stranger).status_code == 401
    user = {"Authorization": f"Bearer {token}"}
    assert api.get(f"/api/v1/services/{sid}", headers=user).status_code == 200
    assert api.get("/api/v1/services/snope").status_code == 404
    assert api.delete("/api/v1/services/snope").status_code == 404


@pytest.mark.parametrize(
    ("text", "want_line", "want_field"),
    [
        ("kind: service\nname: s\nreplicas: 0\n", 3, "replicas"),
        ("name: s\nmodel: smollm2-135m\nport: 70000\n", 3, "port"),
        ("kind: sevrice\nname: s\n", 1, "kind"),
    ],
    ids=["zero-replicas", "port-out-of-range", "unknown-kind"],
)
def test_a_malformed_service_file_names_line_and_field_and_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    want_line: int,
    want_field: str,
) -> None:
    from argosy.cli.app import main

    path = tmp_path / "svc.yaml"
    path.write_text(text)
    monkeypatch.setattr(
        "sys.argv", ["argosy", "submit", str(path), "--server", "http://127.0.0.1:9"]
    )
    with pytest.raises(SystemExit) as done:
        main()
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err
    assert f"svc.yaml:{want_line}" in err and want_field in err, err


def test_a_node_that_joins_later_is_placed_on_and_running_work_stays(tmp_path: Path) -> None:
    from argosy.server.config import ServerConfig
    from argosy.server.control import Control
    from argosy.server.service_spec import ServiceSpec
    from argosy.server.spec import JobSpec
    from argosy.server.store import Store

    config = ServerConfig(home=tmp_path, min_cycle_gap_s=0.0, nodes_interval_s=1e-6)
    store, fake = Store(config.database_url), FakeExecutor([NodeInfo("n0", "cpu", 3)])
    ctl = Control(config, store, fake)
    ctl.recover()
    sid = ctl.submit_service(ServiceSpec(name="s", replicas=1))["id"]
    first, _ = ctl.submit(JobSpec(name="a", script="x.py", nproc_per_node=1), None, "")
    second, _ = ctl.submit(JobSpec(name="b", script="x.py", nproc_per_node=2), None, "")
    for _ in range(3):
        ctl.step()
    assert set(fake.running) == {f"{sid}.r0", first["id"]}  # b waits for devices
    fake.nodes.append(NodeInfo("n1", "cpu", 2))
    for _ in range(3):
        ctl.step()
    assert fake.running[second["id"]].nodes == {"n1": 2}
    assert len(fake.started) == 3 and len(set(fake.started)) == 3  # nothing started twice
    assert sorted(n.name for n in ctl.scheduling.nodes) == ["n0", "n1"]
    assert ctl.scheduling.used_on("n0") == 2 and ctl.scheduling.used_on("n1") == 2
    assert store.get_job(second["id"])["state"] == "running"
    kinds = [e["kind"] for e in store.list_events(limit=500)[0]]
    assert "node_joined" in kinds
    ctl.services.close()
    store.close()


def test_each_service_has_a_key_only_its_queue_reads_and_replicas_get_it_by_env(
    tmp_path: Path,
) -> None:
    """A service's `/v1` routes need its API key: the replicas get it in their environment
    (not their command line, which every user can read), its queue's tokens and admins can
    read it, another queue's token cannot."""
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: org\n    children:\n      - name: a\n      - name: b\n")
    fake = FakeExecutor(NODES)
    home = tmp_path / "home"
    with TestClient(create_app(fast_config(home, queues_file=queues), executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        ids = [
            api.post("/api/v1/services", json={"name": f"s{q}", "queue": q}).json()["id"]
            for q in ("a", "b")
        ]
        wait_until(api, ids[0], lambda s: len(s["replicas"]) == 1)
        key = api.get(f"/api/v1/services/{ids[0]}/key").json()["api_key"]
        other = api.get(f"/api/v1/services/{ids[1]}/key").json()["api_key"]
        assert key.startswith("sk-argosy-") and key != other
        request = fake.running[f"{ids[0]}.r0"]
        assert request.env["ARGOSY_SERVE_API_KEY"] == key
        assert key not in " ".join(request.command)
        token = api.post("/api/v1/tokens", json={"queue": "a", "name": "u"}).json()["token"]
        user = {"Authorization": f"Bearer {token}"}
        assert api.get(f"/api/v1/services/{ids[0]}/key", headers=user).json()["api_key"] == key
        denied = api.get(f"/api/v1/services/{ids[1]}/key", headers=user)
        assert denied.status_code == 403 and other not in denied.text
