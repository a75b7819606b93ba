"""The tidal and elastic blocks of the specs: field errors from the API (422) and the CLI
(file, line and field; exit 2), and the forecast the scheduler is fed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from argosy.server.scheduling import forecast_profile
from argosy.server.service_spec import TidalSpec

BAD_SERVICES = {
    "level above 1": ({"levels": [1.0, 1.5]}, ["tidal", "levels", 1]),
    "negative lead": ({"levels": [1.0], "lead_s": -1}, ["tidal", "lead_s"]),
    "floor above replicas": ({"levels": [1.0], "min_replicas": 3}, ["tidal"]),
    "no levels": ({"levels": []}, ["tidal", "levels"]),
    "unknown key": ({"levels": [1.0], "peak": 3}, ["tidal", "peak"]),
}


@pytest.mark.parametrize(("tidal", "want_loc"), BAD_SERVICES.values(), ids=BAD_SERVICES.keys())
def test_a_bad_tidal_block_is_a_422_naming_the_field(
    client: TestClient, tidal: dict, want_loc: list
) -> None:
    r = client.post("/api/v1/services", json={"name": "s", "replicas": 2, "tidal": tidal})
    assert r.status_code == 422
    assert [d["loc"][1:] for d in r.json()["detail"]][0] == want_loc


BAD_JOBS = {
    "min above max": ({"nnodes": 1, "elastic": {"min_nnodes": 3, "max_nnodes": 2}}, ["elastic"]),
    "nnodes outside": ({"nnodes": 3, "elastic": {"min_nnodes": 1, "max_nnodes": 2}}, ["elastic"]),
    "max missing": ({"elastic": {"min_nnodes": 1}}, ["elastic", "max_nnodes"]),
}


@pytest.mark.parametrize(("extra", "want_loc"), BAD_JOBS.values(), ids=BAD_JOBS.keys())
def test_a_bad_elastic_block_is_a_422_naming_the_field(
    client: TestClient, extra: dict, want_loc: list
) -> None:
    r = client.post("/api/v1/jobs", json={"name": "j", "script": "t.py"} | extra)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][1:] == want_loc


def test_the_cli_refuses_a_bad_tidal_file_with_its_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text("kind: service\nname: chat\ntidal:\n  levels: [1, 0.5, 2]\n")
    done = subprocess.run(
        [sys.executable, "-m", "argosy", "submit", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "svc.yaml:4 field 'tidal.levels.2'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_forecast_is_each_level_raised_to_the_highest_within_the_lead() -> None:
    levels = [0.0, 0.0, 1.0, 0.0, 0.5, 0.0]
    got = forecast_profile(levels, lead_s=20.0, step_s=10.0)
    want = np.array([1.0, 1.0, 1.0, 0.5, 0.5, 0.0])
    assert np.array_equal(got, want)
    assert np.array_equal(forecast_profile(levels, 0.0, 10.0), np.array(levels))


def test_offset_rotates_the_levels_and_the_floor_holds() -> None:
    spec = TidalSpec(levels=[1.0, 0.0, 0.0, 0.0], period_s=40.0, offset_s=10.0, min_replicas=1)
    assert spec.profile(4) == [0.25, 1.0, 0.25, 0.25]
