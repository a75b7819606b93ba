"""Energy in the control plane: rows per attempt and node, sums per job and node, the fleet
over time, the energy factor with a configured PUE, and the routes that show them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import fast_config, job_body, wait_for

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig
from argosy.server.energy import EnergyLedger, attempt_rows, live_energy, spread
from argosy.server.store import Store
from argosy.server.summaries import settle_summary, stamp_attempt


def summary(total: float | None, productive: float = 0.0, wall: float = 100.0) -> dict:
    if total is None:
        energy = {"measured": False, "reason": "rapl: no powercap", "devices": {}}
    else:
        devices = {"gpu0": {"method": "counter"}, "cpu-package-0": {"method": "counter"}}
        energy = {
            "measured": True,
            "total_j": total,
            "productive_j": productive,
            "devices": devices,
        }
    return {"status": "completed", "wall_s": wall, "energy": energy}


@pytest.fixture
def ledger(tmp_path: Path) -> EnergyLedger:
    return EnergyLedger(Store(f"sqlite:///{tmp_path}/s.db").engine, pue=1.25)


def test_a_single_node_attempt_is_one_row_that_ran_its_wall_time() -> None:
    (row,) = attempt_rows("j1", 2, ["n0"], summary(5000.0, 4000.0, wall=50.0), ended_s=1000.0)
    assert row["node"] == "n0" and row["attempt"] == 2
    assert (row["started_at"], row["ended_at"]) == (950.0, 1000.0)
    assert (row["total_j"], row["productive_j"]) == (5000.0, 4000.0)
    assert "2 device(s): counter" in row["detail"]


@pytest.mark.parametrize(
    ("kept", "want_detail"),
    [
        (summary(None), "not measured: rapl: no powercap"),
        ({"status": "missing", "detail": "attempt 1 wrote no final summary.json"}, "no final"),
        ({"status": "completed", "wall_s": 3.0}, "reported no energy"),
    ],
    ids=["meter-read-nothing", "summary-missing", "before-the-meter"],
)
def test_an_unmeasured_attempt_is_a_row_without_joules_saying_why(kept, want_detail) -> None:
    (row,) = attempt_rows("j1", 1, ["n0"], kept, ended_s=10.0)
    assert row["total_j"] is None and want_detail in row["detail"]


def test_a_multi_node_attempt_is_one_row_per_node() -> None:
    kept = summary(300.0, 200.0) | {
        "nodes": [
            {"node_rank": 0, "node": "a", "wall_s": 10.0, "energy_j": 300.0, "productive_j": 200.0},
            {"node_rank": 1, "node": "b", "wall_s": 9.0, "energy_detail": "not measured: x"},
        ]
    }
    rows = attempt_rows("j1", 1, ["a", "b"], kept, ended_s=100.0)
    assert [(r["node"], r["total_j"], r["started_at"]) for r in rows] == [
        ("a", 300.0, 90.0),
        ("b", None, 91.0),
    ]


def test_sums_per_job_and_node_and_the_energy_factor(ledger: EnergyLedger) -> None:
    ledger.record_attempt("j1", 1, ["n0"], summary(1000.0, 600.0, wall=100.0), ended_s=1100.0)
    ledger.record_attempt("j1", 2, ["n1"], summary(500.0, 400.0, wall=50.0), ended_s=1200.0)
    ledger.record_attempt("j2", 1, ["n0"], summary(None), ended_s=1150.0)
    job = ledger.job("j1")
    assert (job["total_j"], job["productive_j"], job["attempts"]) == (1500.0, 1000.0, 2)
    fleet = ledger.fleet(now_s=1200.0, window_s=200.0, buckets=4)
    assert fleet["total_j"] == 1500.0 and fleet["unmeasured"] == 1
    assert fleet["energy_factor"] == pytest.approx(1000.0 / (1500.0 * 1.25), abs=1e-4)
    assert "configured" in fleet["pue_source"] and fleet["pue"] == 1.25
    by_node = {n["node"]: n for n in fleet["nodes"]}
    assert by_node["n0"]["total_j"] == 1000.0 and by_node["n0"]["unmeasured"] == 1
    assert by_node["n1"]["total_j"] == 500.0
    assert sum(s["joules"] for s in fleet["series"]) == pytest.approx(1500.0)
    # j1 attempt 1 ran 1000-1100 (the first two 50-s slices), attempt 2 ran 1150-1200
    assert [s["joules"] for s in fleet["series"]] == pytest.approx([500.0, 500.0, 0.0, 500.0])


def test_without_a_pue_the_factor_is_over_it_energy_and_says_so(tmp_path: Path) -> None:
    ledger = EnergyLedger(Store(f"sqlite:///{tmp_path}/s.db").engine)
    ledger.record_attempt("j1", 1, ["n0"], summary(100.0, 80.0), ended_s=50.0)
    fleet = ledger.fleet(now_s=60.0, window_s=120.0, buckets=2)
    assert fleet["energy_factor"] == 0.8 and fleet["pue"] is None
    assert "not configured" in fleet["pue_source"]


def test_no_measured_attempt_gives_no_factor(ledger: EnergyLedger) -> None:
    ledger.record_attempt("j1", 1, ["n0"], summary(None), ended_s=50.0)
    fleet = ledger.fleet(now_s=60.0, window_s=120.0, buckets=2)
    assert fleet["total_j"] is None and fleet["energy_factor"] is None


RUNS = st.lists(
    st.tuples(st.floats(0, 1000), st.floats(0, 500), st.floats(0, 1e6)), min_size=1, max_size=20
)


@settings(max_examples=80, deadline=None)
@given(runs=RUNS, buckets=st.integers(1, 50))
def test_spread_keeps_every_joule_that_ran_inside_the_window(runs, buckets) -> None:
    rows = [
        {"started_at": a, "ended_at": a + d, "total_j": j} for a, d, j in runs
    ]  # all inside [0, 1500]
    series = spread(rows, 0.0, 1500.0, buckets)
    assert len(series) == buckets
    assert sum(s["joules"] for s in series) == pytest.approx(
        sum(j for *_, j in runs), rel=1e-6, abs=0.01 * buckets
    )
    assert all(s["joules"] >= 0 for s in series)


def test_routes_show_a_finished_job_and_the_fleet(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with TestClient(create_app(fast_config(home, pue=1.4))) as client:
        client.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        job_id = client.post("/api/v1/jobs", json=job_body()).json()["id"]
        wait_for(client, job_id, {"succeeded"})
        got = client.get(f"/api/v1/jobs/{job_id}/energy")
        assert got.status_code == 200, got.text
        body = got.json()
        (row,) = body["rows"]
        assert row["attempt"] == 1 and row["node"]
        assert body["runtime"] is not None  # the launcher's section, measured or not
        if body["runtime"]["measured"]:  # a host whose RAPL or NVML reads
            assert row["total_j"] > 0 and body["total_j"] == row["total_j"]
        else:
            assert row["total_j"] is None and "not measured" in row["detail"]
        fleet = client.get("/api/v1/energy", params={"window_h": 1, "buckets": 6}).json()
        assert fleet["pue"] == 1.4 and "configured" in fleet["pue_source"]
        assert len(fleet["series"]) == 6 and fleet["attempts"] == 1
        metrics = client.get("/metrics").text
        assert "argosy_pue_configured 1.4" in metrics
        measured = body["runtime"]["measured"]
        assert ("argosy_energy_factor " in metrics) is bool(measured)  # absent, never a 0
        assert client.get("/api/v1/jobs/nope/energy").status_code == 404
        bad = client.get("/api/v1/energy", params={"window_h": 0})
        assert bad.status_code == 422 and "window_h" in bad.text


def test_a_multi_node_attempt_keeps_each_nodes_joules(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stamp_attempt(run_dir, 1)
    (run_dir / "node1").mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary(900.0, 700.0, wall=30.0)))
    (run_dir / "node1" / "summary.json").write_text(json.dumps(summary(None, wall=29.0)))
    kept = settle_summary(run_dir, 1, "", nodes=["a", "b"])
    assert kept["nodes"][0]["energy_j"] == 900.0 and "energy_j" not in kept["nodes"][1]
    rows = attempt_rows("j1", 1, ["a", "b"], kept, ended_s=100.0)
    assert [(r["node"], r["total_j"], r["productive_j"]) for r in rows] == [
        ("a", 900.0, 700.0),
        ("b", None, None),
    ]
    assert "not measured: rapl: no powercap" in rows[1]["detail"]


def _log(run_dir: Path, *records: object, torn: str = "") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + torn
    (run_dir / "energy.jsonl").write_text(text)


HEADER = {"devices": {"gpu0": "counter", "gpu1": "counter"}, "unavailable": {}}


def test_live_energy_is_the_last_line_logged(tmp_path: Path) -> None:
    line = {"t": 12.5, "d": {"gpu0": [300.0, 210.0], "gpu1": [100.0, None]}}
    _log(tmp_path / "a", HEADER, {"t": 2.0, "d": {"gpu0": [10.0, 1.0]}}, line, torn='{"t": 13')
    assert live_energy(tmp_path / "a") == {
        "seconds": 12.5,
        "total_j": 400.0,
        "devices": {"gpu0": 300.0, "gpu1": 100.0},
    }
    _log(tmp_path / "b", HEADER)
    assert live_energy(tmp_path / "b") is None  # nothing sampled yet
    assert live_energy(tmp_path / "absent") is None
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "energy.jsonl").symlink_to(tmp_path / "a" / "energy.jsonl")
    assert live_energy(tmp_path / "c") is None  # a link the job planted is not followed


def test_a_running_job_shows_its_energy_so_far(tmp_path: Path) -> None:
    config = ServerConfig(home=tmp_path / "home", cycle_interval_s=0.2)
    with TestClient(create_app(config, FakeExecutor([NodeInfo("n0", "cpu", 4)]))) as client:
        token = (tmp_path / "home" / "admin.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        ctl = client.app.state.control
        row, _ = ctl.store.insert_job({"name": "r", "queue": "default", "script": "x.py"}, now=0)
        ctl.store.update_job(row["id"], {"state": "running"})
        _log(ctl.run_dir(row["id"]), HEADER, {"t": 4.0, "d": {"gpu0": [800.0, 200.0]}})
        body = client.get(f"/api/v1/jobs/{row['id']}/energy").json()
        assert body["live"] == {"seconds": 4.0, "total_j": 800.0, "devices": {"gpu0": 800.0}}
        assert body["rows"] == [] and body["total_j"] is None
