"""The console's live figures while work runs: a running job's goodput from its runtime
events (not 0% until the final summary), a cordoned node that still shows the devices in
use on it and what runs there, and a pending job whose wait a cordon causes saying so.
Real launches through the local executor for the goodput; a fake executor for cordons."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_helpers import login_client
from fastapi.testclient import TestClient

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).resolve().parents[1] / "server" / "scripts"
WORKDIR = str(SCRIPTS)


def fast_config(home: Path) -> ServerConfig:
    """A quick control loop; jobs run as this user even under root (no isolation here)."""
    values = {"home": home, "local_slots": 2, "poll_interval_s": 0.05, "cycle_interval_s": 0.2}
    return ServerConfig.model_validate(values | {"allow_root_jobs": True})


def wait_for(client: TestClient, job_id: str, states: set[str], timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (job := client.get(f"/api/v1/jobs/{job_id}").json())["state"] not in states:
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    return job


def admin_client(app: object, home: Path) -> Iterator[TestClient]:
    with TestClient(app) as client:
        token = (home / "admin.token").read_text().strip()
        login_client(client, token)
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


@pytest.fixture
def live(tmp_path: Path) -> Iterator[TestClient]:
    home = tmp_path / "home"
    yield from admin_client(create_app(fast_config(home)), home)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[TestClient]:
    home = tmp_path / "home"
    nodes = [NodeInfo("n0", "cpu", 4), NodeInfo("n1", "cpu", 4)]
    yield from admin_client(create_app(fast_config(home), FakeExecutor(nodes)), home)


def percent_after(label: str, html: str) -> float:
    found = re.search(re.escape(label) + r"</td>\s*<td[^>]*>([0-9.]+)%", html)
    assert found, html[:3000]
    return float(found.group(1))


def steps_logged(run_dir: Path) -> int:
    try:
        return (run_dir / "events.jsonl").read_text().count('"event": "step"')
    except OSError:
        return 0


def test_a_running_jobs_goodput_is_live_on_its_page_and_the_overview(live: TestClient) -> None:
    body = {
        "name": "long",
        "script": str(SCRIPTS / "progress.py"),
        "workdir": WORKDIR,
        "args": ["--steps", "2000", "--step-s", "0.05"],
    }
    job = live.post("/api/v1/jobs", json=body).json()
    wait_for(live, job["id"], {"running"}, timeout_s=60)
    run_dir = live.app.state.control.run_dir(job["id"])
    deadline = time.monotonic() + 60
    while steps_logged(run_dir) < 10:
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.1)
    page = live.get(f"/jobs/{job['id']}/live")
    assert page.status_code == 200
    assert percent_after("effective training time", page.text) > 0.0
    assert "so far (the run has not ended)" in page.text
    overview = live.get("/overview/live").text
    factor = re.search(r"effective training time.*?([0-9.]+)%", overview, re.S)
    assert factor and float(factor.group(1)) > 0.0, overview[:3000]
    assert "1 running job(s) so far" in overview
    assert live.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "running"  # still live
    live.post(f"/api/v1/jobs/{job['id']}/cancel")
    wait_for(live, job["id"], {"cancelled"}, timeout_s=60)
    assert 'data-rank="launcher"' in live.get(f"/jobs/{job['id']}").text  # streamed there
    out = live.get(f"/jobs/{job['id']}/log", params={"rank": "launcher"}).json()
    want = live.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": "launcher"}).text
    assert out["file"].startswith("server/attempt1/output.log@")  # its place and inode
    assert out["text"] == want and want


def test_a_cordoned_node_still_shows_what_runs_on_it(fake: TestClient) -> None:
    job = fake.post("/api/v1/jobs", json=job4("busy")).json()
    running = wait_for(fake, job["id"], {"running"})
    node = next(iter(running["placement"]["nodes"]))
    assert fake.post(f"/api/v1/nodes/{node}/cordon").status_code == 200
    view = next(n for n in fake.get("/api/v1/nodes").json() if n["name"] == node)
    assert view["cordoned"] and view["used"] == 4 and view["free"] == 0
    assert view["jobs"] == [job["id"]]
    html = fake.get("/nodes", headers={"HX-Request": "true"}).text
    row = re.search(rf'<tr data-node="{node}">.*?</tr>', html, re.S)
    assert row and job["id"] in row.group(0) and "cordoned" in row.group(0)
    squares = re.search(rf'<span class="mono">{node}</span>(.*?)</div>', html, re.S)
    assert squares and squares.group(1).count('class="dev used"') == 4, html


def test_a_pending_job_behind_a_cordon_names_the_node(fake: TestClient) -> None:
    busy = fake.post("/api/v1/jobs", json=job4("busy")).json()
    running = wait_for(fake, busy["id"], {"running"})
    idle = next(
        n["name"]
        for n in fake.get("/api/v1/nodes").json()
        if n["name"] not in running["placement"]["nodes"]
    )
    fake.post(f"/api/v1/nodes/{idle}/cordon")
    waiting = fake.post("/api/v1/jobs", json=job4("waits")).json()
    time.sleep(0.5)  # a few scheduler cycles: it stays pending
    assert fake.get(f"/api/v1/jobs/{waiting['id']}").json()["state"] == "pending"
    queues = fake.get("/queues").text
    want = f"node cordoned: {idle} (4 idle); needs 4 devices, 0 free elsewhere"
    assert want in queues, queues[:3000]
    assert "0 free" not in queues.replace("0 free elsewhere", "")
    assert want in fake.get(f"/jobs/{waiting['id']}/live").text


def job4(name: str) -> dict:
    return {
        "name": name,
        "script": str(SCRIPTS / "steps.py"),
        "workdir": WORKDIR,
        "nproc_per_node": 4,
    }
