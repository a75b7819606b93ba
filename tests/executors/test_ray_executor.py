"""The Ray executor on a real two-node Ray cluster (head + worker by `ray start`): a gang
across both nodes as one placement group, and a worker node lost mid-run: the attempt
fails, the job resumes on the other node from its checkpoint, the event log says why;
a node that joins the cluster later is seen by the running server and placed on.

One cluster for the module (Ray's start-up is the expensive part); the node-loss test
kills the worker, so it runs last.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from ray_helpers import RayCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from server_helpers import TERMINAL, fast_config, job_body, wait_for  # noqa: E402

from argosy.server.app import create_app  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    c = RayCluster(tmp_path_factory.mktemp("ray"))
    yield c
    import ray

    ray.shutdown()
    c.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server") / "home"


@pytest.fixture(scope="module")
def client(cluster: RayCluster, home: Path) -> Iterator[TestClient]:
    config = fast_config(home, executor="ray", ray_address=cluster.address, nodes_interval_s=0.5)
    with TestClient(create_app(config)) as c:
        c.headers["Authorization"] = "Bearer " + (home / "admin.token").read_text().strip()
        yield c


def test_inventory_has_both_nodes_with_their_chip_resources(client: TestClient) -> None:
    nodes = client.get("/api/v1/nodes").json()
    assert [(n["chip"], n["devices"]) for n in nodes] == [("cpu", 2), ("cpu", 2)]


def test_a_gang_spans_both_nodes_in_one_placement_group(client: TestClient, home: Path) -> None:
    body = job_body("gang", nproc_per_node=2, nnodes=2, args=["--steps", "3"])
    job = client.post("/api/v1/jobs", json=body).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=90)
    assert done["state"] == "succeeded", done
    assert sorted(done["placement"]["nodes"].values()) == [2, 2]
    run = home / "runs" / job["id"]
    for node_dir in (run, run / "node1"):  # node rank 0 and 1 each ran their two ranks
        assert len((node_dir / "starts.txt").read_text().split("\n")) == 3


def test_a_lost_worker_node_fails_the_attempt_and_the_job_resumes(
    client: TestClient, cluster: RayCluster, home: Path
) -> None:
    worker = cluster.worker_node_id()[:8]
    names = [n["name"] for n in client.get("/api/v1/nodes").json()]
    head = next(n for n in names if not n.endswith(worker))
    client.post(f"/api/v1/nodes/{head}/cordon")  # the job must land on the worker
    body = job_body("lose", nproc_per_node=2, args=["--steps", "80", "--step-s", "0.1"])
    job = client.post("/api/v1/jobs", json=body | {"checkpoint_every": 2})
    job = job.json()
    running = wait_for(client, job["id"], {"running"}, timeout_s=60)
    assert next(iter(running["placement"]["nodes"])).endswith(worker)
    ckpt = home / "runs" / job["id"] / "ckpt.txt"
    deadline = time.monotonic() + 60
    while not (ckpt.exists() and int(ckpt.read_text()) >= 4):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cluster.kill_worker()
    lost = wait_for(
        client, job["id"], {"pending", "admitted", "running"} - {"running"} | TERMINAL, timeout_s=60
    )
    assert lost["attempts"] == 1 and "died" in lost["reason"], lost
    client.post(f"/api/v1/nodes/{head}/uncordon")
    done = wait_for(client, job["id"], TERMINAL, timeout_s=90)
    assert done["state"] == "succeeded" and done["attempts"] == 2, done
    assert next(iter(done["placement"]["nodes"])) == head
    firsts = [
        int(line.split()[1])
        for line in (home / "runs" / job["id"] / "starts.txt").read_text().split("\n")
        if line
    ]
    assert firsts[:2] == [1, 1] and min(firsts[2:]) >= 5  # two ranks each time
    events = client.get("/api/v1/events", params={"limit": 500}).json()["items"]
    kinds = {(e["kind"], e["job_id"]) for e in events}
    assert ("attempt_lost", job["id"]) in kinds and ("node_lost", None) in kinds


def test_a_node_that_joins_later_is_seen_and_placed_on(
    client: TestClient, cluster: RayCluster
) -> None:
    before = {n["name"] for n in client.get("/api/v1/nodes").json()}
    late = cluster.add_worker()[:8]
    deadline = time.monotonic() + 60
    while not any(
        n.endswith(late) for n in {n["name"] for n in client.get("/api/v1/nodes").json()}
    ):
        assert time.monotonic() < deadline, "the joined node never appeared"
        time.sleep(0.25)
    nodes = client.get("/api/v1/nodes").json()
    joined = next(n for n in nodes if n["name"].endswith(late))
    assert joined["up"] and joined["devices"] == 2 and joined["name"] not in before
    for name in before:  # the job must land on the new node
        client.post(f"/api/v1/nodes/{name}/cordon")
    job = client.post("/api/v1/jobs", json=job_body("late", nproc_per_node=2)).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=90)
    assert done["state"] == "succeeded", done
    assert done["placement"]["nodes"] == {joined["name"]: 2}
    events = client.get("/api/v1/events", params={"limit": 500}).json()["items"]
    assert any(e["kind"] == "node_joined" and late in e["message"] for e in events)
