"""`exact_nodes`: a gang of nnodes x nproc_per_node runs on exactly nnodes distinct nodes
(one rank per node, for instance); without it the devices are packed. The launch request
the executor gets carries the shape, so each node runs its own ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import job_body, wait_for

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig


@pytest.mark.parametrize(("exact", "want"), [(True, {"n0": 1, "n1": 1}), (False, None)])
def test_one_rank_per_node_when_asked(tmp_path: Path, exact: bool, want) -> None:
    fake = FakeExecutor([NodeInfo("n0", "cpu", 2), NodeInfo("n1", "cpu", 2)])
    config = ServerConfig(home=tmp_path / "home", cycle_interval_s=0.05)
    with TestClient(create_app(config, fake)) as client:
        token = (tmp_path / "home" / "admin.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        body = job_body("shape", nnodes=2, nproc_per_node=1, exact_nodes=exact)
        r = client.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        wait_for(client, r.json()["id"], {"running"})
        nodes = dict(fake.running[r.json()["id"]].nodes)
        assert sum(nodes.values()) == 2
        if want is not None:
            assert nodes == want
        else:  # packed: both ranks on one node
            assert len(nodes) == 1


def test_exact_nodes_is_refused_for_an_elastic_job(tmp_path: Path) -> None:
    fake = FakeExecutor([NodeInfo("n0", "cpu", 2), NodeInfo("n1", "cpu", 2)])
    with TestClient(create_app(ServerConfig(home=tmp_path / "home"), fake)) as client:
        token = (tmp_path / "home" / "admin.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        elastic = {"min_nnodes": 1, "max_nnodes": 2}
        body = job_body("e", nnodes=1, exact_nodes=True, elastic=elastic)
        r = client.post("/api/v1/jobs", json=body)
        assert r.status_code == 422 and "exact_nodes" in r.text
