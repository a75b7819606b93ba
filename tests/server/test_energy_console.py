"""The console's energy: the /energy page (fleet, per node, over time, the factor with its
configured PUE), the overview's energy factor, and a job page's energy section."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig

RUNTIME_ENERGY = {
    "measured": True,
    "total_j": 1500.0,
    "productive_j": 1000.0,
    "lost_j": {"startup": 100.0, "redone": 400.0},
    "joules_per_step": 10.0,
    "joules_per_step_all_in": 15.0,
    "tokens_per_joule": 12.5,
    "devices": {"gpu0": {"method": "counter", "energy_j": 1500.0, "avg_w": 300.0, "peak_w": 410.0}},
    "how": "per device: its energy counter",
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    home: Path = tmp_path_factory.mktemp("home")
    config = ServerConfig(home=home, cycle_interval_s=0.2, pue=1.2)
    with TestClient(create_app(config, FakeExecutor([NodeInfo("n0", "cpu", 4)]))) as c:
        ctl = c.app.state.control
        now = time.time()
        summary = {"status": "completed", "wall_s": 600.0, "energy": RUNTIME_ENERGY}
        ctl.energy.record_attempt("j1", 1, ["n0"], summary, ended_s=now - 60)
        unmeasured = {"status": "completed", "wall_s": 5.0, "energy": {"measured": False}}
        ctl.energy.record_attempt("j2", 1, ["n1"], unmeasured, ended_s=now - 30)
        row, _ = ctl.store.insert_job(
            {"name": "metered", "queue": "default", "script": "x.py"}, now=now
        )
        ctl.store.update_job(row["id"], {"state": "succeeded", "summary": summary})
        c.app.state.job_id = row["id"]
        token = (home / "admin.token").read_text().strip()
        assert c.post("/login", data={"token": token}, follow_redirects=False).status_code == 303
        yield c


def test_energy_page_shows_the_fleet_the_factor_and_the_configured_pue(client) -> None:
    page = client.get("/energy?window_h=24")
    assert page.status_code == 200
    html = page.text
    factor = re.search(r'id="energy-factor">([^<]+)<', html).group(1)
    assert factor == f"{1000 / (1500 * 1.2) * 100:.1f}%"
    assert re.search(r'id="pue">1.2<', html) and "configured (server config pue = 1.2)" in html
    assert "not metered" in html and 'data-chart="energy"' in html
    assert re.search(r"n0</a></td><td class=\"num\">1.5 kJ", html)
    assert re.search(r"n1</a></td><td class=\"num\">not measured", html)
    assert 'href="/energy"' in html  # in the navigation


def test_energy_page_refuses_a_window_it_does_not_offer(client) -> None:
    page = client.get("/energy?window_h=5")
    assert (
        page.status_code == 422 and "window_h 5 is not offered; known: 1, 6, 24, 168" in page.text
    )


def test_overview_energy_factor_is_measured_with_its_how(client) -> None:
    html = client.get("/?window_h=24").text
    row = re.search(
        r"<td>energy efficiency</td><td class=\"num\">([^<]+)</td><td[^>]*>([^<]+)<", html
    )
    assert row.group(1) == f"{1000 / (1500 * 1.2) * 100:.1f}%"
    assert "PUE configured" in row.group(2) and "not metered" in row.group(2)


def test_job_page_shows_its_energy(client) -> None:
    html = client.get(f"/jobs/{client.app.state.job_id}").text
    assert "Energy of the last attempt" in html
    assert "12.5" in html and "avg 300.0 W, peak 410.0 W" in html and "lost: redone" in html


def test_a_running_jobs_page_shows_its_energy_so_far(client) -> None:
    ctl = client.app.state.control
    row, _ = ctl.store.insert_job({"name": "live", "queue": "default", "script": "x.py"}, now=0)
    ctl.store.update_job(row["id"], {"state": "running"})
    run_dir = ctl.run_dir(row["id"])
    run_dir.mkdir(parents=True)
    header = {"devices": {"gpu0": "counter"}, "unavailable": {}}
    sample = {"t": 30.0, "d": {"gpu0": [4500.0, 150.0]}}
    (run_dir / "energy.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(sample) + "\n")
    html = client.get(f"/jobs/{row['id']}").text
    assert re.search(r'id="energy-live">4500.0 J in 30 s', html), html[:2000]
