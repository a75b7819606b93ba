"""The console's nodes page: a node that is down and holds nothing can be forgotten by an
admin (the same `forget_node` as `DELETE /api/v1/nodes/{name}`), never by a queue token,
never while it is up."""

from __future__ import annotations

import time
from pathlib import Path

from console_helpers import login_client
from fastapi.testclient import TestClient

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig


def test_an_admin_forgets_a_down_node_from_the_nodes_page(tmp_path: Path) -> None:
    fake = FakeExecutor([NodeInfo("n0", "cpu", 2), NodeInfo("n1", "cpu", 2)])
    config = ServerConfig(home=tmp_path, cycle_interval_s=0.2, nodes_interval_s=0.05)
    with TestClient(create_app(config, fake)) as client:
        admin = (tmp_path / "admin.token").read_text().strip()
        body = {"queue": "default", "name": "team"}
        queue = client.post(
            "/api/v1/tokens", json=body, headers={"Authorization": f"Bearer {admin}"}
        ).json()["token"]
        csrf = login_client(client, admin)
        htmx = {"HX-Request": "true", "X-CSRF-Token": csrf}
        assert "/nodes/n1/forget" not in client.get("/nodes").text  # up: no button
        r = client.post("/nodes/n1/forget", headers=htmx)  # an error goes to the flash
        assert r.headers.get("hx-retarget") == "#flash" and "not lost" in r.text
        r = client.post("/nodes/n1/forget", data={"csrf": csrf}, follow_redirects=False)
        assert r.status_code == 409 and "not lost" in r.text  # a plain form: the error page
        fake.nodes.pop()
        deadline = time.monotonic() + 30  # a bound on a wait, not a speed check
        while "n1" not in client.app.state.control.lost:
            assert time.monotonic() < deadline, "the loss was not seen"
            time.sleep(0.02)
        page = client.get("/nodes").text
        assert "/nodes/n1/forget" in page and "/nodes/n0/forget" not in page
        other = TestClient(client.app)
        r = other.post(
            "/nodes/n1/forget",
            headers={"HX-Request": "true", "X-CSRF-Token": login_client(other, queue)},
        )
        assert r.headers.get("hx-retarget") == "#flash" and "admin token" in r.text
        assert "n1" in client.app.state.control.scheduling.index
        r = client.post("/nodes/n1/forget", headers=htmx)
        assert (
            r.status_code == 200 and 'data-node="n1"' not in r.text and 'data-node="n0"' in r.text
        )
        assert "n1" not in client.app.state.control.scheduling.index
