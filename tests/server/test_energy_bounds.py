"""A job's reported joules are its word: the control plane counts them only within what
its placement can draw in the time the server saw it run, and productive joules only
up to the total; past either the row is kept, unmeasured, saying what it claimed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.hardware.catalog import default_catalog
from argosy.server.energy import EnergyLedger, attempt_rows
from argosy.server.energy_bounds import (
    HOST_ALLOWANCE_W,
    SLACK_J,
    TDP_MARGIN,
    bound_rows,
    node_ceilings_w,
)
from argosy.server.store import Store


def kept(total: float, productive: float, wall: float) -> dict:
    energy = {"measured": True, "total_j": total, "productive_j": productive, "devices": {}}
    return {"status": "completed", "wall_s": wall, "energy": energy}


def test_a_node_s_ceiling_is_its_devices_board_power_with_margin_and_host() -> None:
    tdp = default_catalog().get("h100").tdp_w
    got = node_ceilings_w({"chip": "h100", "nodes": {"a": 8, "b": 2}})
    assert got == {
        "a": 8 * tdp * TDP_MARGIN + HOST_ALLOWANCE_W,
        "b": 2 * tdp * TDP_MARGIN + HOST_ALLOWANCE_W,
    }
    assert node_ceilings_w({"chip": "no-such-chip", "nodes": {"a": 1}}) == {}
    assert node_ceilings_w(None) == {}


def test_a_claim_past_the_ceiling_is_kept_unmeasured_and_enters_no_sum(tmp_path: Path) -> None:
    ledger = EnergyLedger(Store(f"sqlite:///{tmp_path}/s.db").engine)
    ceilings = node_ceilings_w({"chip": "h100", "nodes": {"n0": 1}})
    honest = kept(total=600.0 * 100, productive=500.0 * 100, wall=100.0)
    ledger.record_attempt("j1", 1, ["n0"], honest, 1100.0, started_s=1000.0, ceilings_w=ceilings)
    inflated = kept(total=1e12, productive=1e12, wall=100.0)
    (row,) = ledger.record_attempt(
        "j2", 1, ["n0"], inflated, 1100.0, started_s=1000.0, ceilings_w=ceilings
    )
    assert row["total_j"] is None and "reported 1e+12 J" in row["detail"]
    assert "at most" in row["detail"] and "100.0 s" in row["detail"]
    fleet = ledger.fleet(1200.0, 3600.0, 4)
    assert fleet["total_j"] == 60000.0 and fleet["unmeasured"] == 1


def test_more_productive_joules_than_joules_is_not_counted() -> None:
    rows = attempt_rows("j1", 1, ["n0"], kept(100.0, 500.0, wall=10.0), ended_s=10.0)
    (row,) = bound_rows(rows, started_s=0.0, ended_s=10.0, ceilings_w={})
    assert row["total_j"] is None and "more productive joules than joules" in row["detail"]


def test_a_row_never_starts_before_the_server_started_the_attempt() -> None:
    rows = attempt_rows("j1", 1, ["n0"], kept(10.0, 5.0, wall=1e6), ended_s=100.0)
    (row,) = bound_rows(rows, started_s=90.0, ended_s=100.0, ceilings_w={})
    assert (row["started_at"], row["ended_at"], row["total_j"]) == (90.0, 100.0, 10.0)


figures = st.floats(min_value=0, max_value=1e15, allow_nan=False)


@given(
    total=figures,
    productive=figures,
    wall=st.floats(min_value=0, max_value=1e6),
    window=st.floats(min_value=0, max_value=1e5),
    devices=st.integers(min_value=1, max_value=16),
    chip=st.sampled_from(["h100", "a100-80g", "910b", "cpu"]),
)
def test_every_counted_row_is_within_what_its_node_can_draw(
    total: float, productive: float, wall: float, window: float, devices: int, chip: str
) -> None:
    ceilings = node_ceilings_w({"chip": chip, "nodes": {"n0": devices}})
    rows = attempt_rows("j", 1, ["n0"], kept(total, productive, wall), ended_s=1e6)
    (row,) = bound_rows(rows, started_s=1e6 - window, ended_s=1e6, ceilings_w=ceilings)
    assert 1e6 - window <= row["started_at"] <= row["ended_at"] == 1e6
    if row["total_j"] is None:
        assert row["detail"].startswith("not counted: reported")
    else:
        assert row["total_j"] <= ceilings["n0"] * window + SLACK_J
        assert row["productive_j"] <= row["total_j"] + SLACK_J
        assert row["total_j"] == pytest.approx(total)


def test_the_control_plane_does_not_count_a_job_s_inflated_claim(tmp_path: Path) -> None:
    """Through the server: one job's summary claims 1e15 J for a run of seconds, another
    what a CPU slot can draw; only the second enters the job's and the fleet's sums."""
    import json

    from fastapi.testclient import TestClient
    from server_helpers import fast_config, job_body, wait_for

    from argosy.executors.base import NodeInfo
    from argosy.executors.fake import FakeExecutor
    from argosy.server.app import create_app

    fake = FakeExecutor([NodeInfo("n0", "cpu", 4)])
    with TestClient(create_app(fast_config(tmp_path / "home"), fake)) as client:
        token = (tmp_path / "home" / "admin.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        ctl = client.app.state.control
        joules = {}
        for name, total in (("liar", 1e15), ("honest", 5.0)):
            job_id = client.post("/api/v1/jobs", json=job_body(name)).json()["id"]
            wait_for(client, job_id, {"running"})
            claim = kept(total=total, productive=total / 2, wall=0.5)
            (ctl.run_dir(job_id) / "summary.json").write_text(json.dumps(claim))
            fake.finish(job_id, 0)
            wait_for(client, job_id, {"succeeded"})
            joules[name] = client.get(f"/api/v1/jobs/{job_id}/energy").json()
        (lie,) = joules["liar"]["rows"]
        assert lie["total_j"] is None and "not counted: reported 1e+15 J" in lie["detail"]
        assert joules["honest"]["total_j"] == 5.0
        fleet = client.get("/api/v1/energy", params={"window_h": 1, "buckets": 2}).json()
        assert fleet["total_j"] == 5.0 and fleet["unmeasured"] == 1
