"""What a tenant writes is bounded in what the server stores and lists: a job's own
summary.json, a job spec's arguments, and the rows of the jobs listing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.server.spec import MAX_ARG_CHARS, MAX_ARGS_CHARS
from argosy.server.summaries import (
    DROPPED_KEY,
    STORED_LIMIT_BYTES,
    capped,
    marker_name,
    settle_summary,
    stamp_attempt,
)

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_summary_is_kept_whole() -> None:
    summary = {"status": "completed", "step": 10, "attempt": 1}
    assert capped(summary) == summary


def test_a_huge_summary_keeps_what_fits_and_names_what_went() -> None:
    summary = {"status": "completed", "attempt": 1, "blob": "x" * (1 << 20), "pad": "y" * 100}
    out = capped(summary)
    assert len(json.dumps(out)) <= STORED_LIMIT_BYTES
    assert out["status"] == "completed" and out["attempt"] == 1 and out["pad"] == "y" * 100
    assert "blob" not in out and out[DROPPED_KEY]["keys"] == ["blob"]


def test_many_keys_are_capped_too() -> None:
    summary = {f"k{i}": "v" * 100 for i in range(5000)} | {"attempt": 1}
    out = capped(summary)
    assert len(json.dumps(out)) <= STORED_LIMIT_BYTES
    assert out["attempt"] == 1 and out[DROPPED_KEY]["more"] > 0


@pytest.mark.parametrize(
    "summary",
    [
        {f"k{i}": 0 for i in range(6904)},  # tiny entries: their separators count
        {("\U0001f600" * 60) + str(i): list(range(3000)) for i in range(22)},  # escaped names
    ],
    ids=["many-tiny-keys", "astral-names"],
)
def test_a_capped_summary_never_passes_the_cap(summary: dict) -> None:
    out = capped(summary | {"attempt": 1})
    assert len(json.dumps(out)) <= STORED_LIMIT_BYTES
    assert out["attempt"] == 1


def test_a_long_faults_list_keeps_its_newest_faults() -> None:
    faults = [{"step": i, "kind": "rank_lost", "detail": "d" * 150} for i in range(1000)]
    out = capped({"status": "completed", "attempt": 1, "faults": faults})
    assert len(json.dumps(out)) <= STORED_LIMIT_BYTES
    kept = out["faults"]
    assert 100 < len(kept) < 1000 and kept == faults[-len(kept) :]
    assert out[DROPPED_KEY]["shortened"] == {"faults": {"kept": len(kept), "of": 1000}}
    assert out[DROPPED_KEY]["keys"] == []


_VALUES = st.one_of(
    st.integers(),
    st.text(max_size=30_000),
    st.lists(st.text(max_size=3_000), max_size=60),
    st.lists(st.dictionaries(st.text(max_size=5), st.integers(), max_size=30), max_size=400),
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=80), _VALUES, max_size=14), st.integers(1, 9))
def test_a_capped_summary_fits_and_keeps_only_whole_keys_or_list_tails(
    summary: dict, attempt: int
) -> None:
    summary = summary | {"attempt": attempt}
    out = capped(summary, limit=32 << 10)
    assert len(json.dumps(out)) <= 32 << 10
    assert out["attempt"] == attempt
    said = out.get(DROPPED_KEY, {"keys": [], "more": 0, "shortened": {}})
    for key, value in summary.items():
        if key not in out:
            assert marker_name(key) in said["keys"] or said["more"] > 0
        elif out[key] != value:
            assert isinstance(value, list) and out[key] == value[len(value) - len(out[key]) :]
            if sum(marker_name(k) == marker_name(key) for k in summary) == 1:  # names are cut
                shown = said["shortened"][marker_name(key)]
                assert shown == {"kept": len(out[key]), "of": len(value)}


def test_a_jobs_own_15_mib_summary_is_stored_capped(tmp_path: Path) -> None:
    stamp_attempt(tmp_path, 1)
    time.sleep(0.01)
    data = {"status": "completed", "step": 5, "junk": "z" * (15 << 20)}
    (tmp_path / "summary.json").write_text(json.dumps(data))
    stored = settle_summary(tmp_path, 1, "")
    assert len(json.dumps(stored)) <= STORED_LIMIT_BYTES
    assert stored["status"] == "completed" and DROPPED_KEY in stored


@pytest.fixture
def api(tmp_path: Path) -> TestClient:
    from argosy.executors.base import NodeInfo
    from argosy.executors.fake import FakeExecutor
    from argosy.server.app import create_app
    from argosy.server.config import ServerConfig

    config = ServerConfig(home=tmp_path / "home", cycle_interval_s=0.2)
    with TestClient(create_app(config, FakeExecutor([NodeInfo("n0", "cpu", 1)]))) as client:
        token = (config.home / "admin.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def _job(**extra: object) -> dict:
    script = str(ROOT / "tests" / "server" / "scripts" / "steps.py")
    return {"name": "a", "script": script, "workdir": "/", "max_restarts": 0} | extra


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["x" * (MAX_ARG_CHARS + 1)], "argument 0"),
        (["x" * MAX_ARG_CHARS] * (MAX_ARGS_CHARS // MAX_ARG_CHARS + 1), "in all"),
    ],
)
def test_oversized_args_are_a_field_error(api: TestClient, args: list[str], said: str) -> None:
    r = api.post("/api/v1/jobs", json=_job(args=args))
    assert r.status_code == 422, r.text[:300]
    (error,) = r.json()["detail"]
    assert error["loc"][-1] == "args" and said in error["msg"]


def test_the_listing_is_slim_and_the_job_is_whole(api: TestClient) -> None:
    args = ["y" * 1000] * 10
    r = api.post("/api/v1/jobs", json=_job(args=args))
    assert r.status_code in (200, 201), r.text[:300]
    job_id = r.json()["id"]
    api.app.state.control.store.update_job(job_id, {"summary": {"status": "x", "big": "q" * 5000}})
    (row,) = api.get("/api/v1/jobs").json()["items"]
    assert row["id"] == job_id and row["summary"] is None
    assert "args" not in row["spec"] and row["spec"]["name"] == "a"
    whole = api.get(f"/api/v1/jobs/{job_id}").json()
    assert whole["spec"]["args"] == args and whole["summary"]["big"] == "q" * 5000
