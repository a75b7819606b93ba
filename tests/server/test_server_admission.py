"""Submit refuses what can never run: a 422 naming the field, and nothing stored.

The API on a fake executor (nothing runs), so each bad input costs one request: a
missing, unreadable, escaping or unrunnable script, a missing or relative workdir,
arguments over the kernel's limits, an unknown serving engine or speculative method,
and values of the wrong type, which the specs take strictly (no bool or float for an
int, no number for a string)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import STEPS, WORKDIR, fast_config

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.admission import MAX_ARG_STRLEN, job_errors
from argosy.server.app import create_app
from argosy.server.spec import JobSpec

GOOD = {"name": "ok", "script": STEPS, "workdir": WORKDIR, "args": ["--steps", "2"]}
PLAIN = "<a plain text file>"
"""Stands for a readable file that is neither .py nor executable (made by the test)."""


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    home = tmp_path_factory.mktemp("home")
    executor = FakeExecutor([NodeInfo("n0", "cpu", 4)])
    config = fast_config(home, max_body_bytes=8 << 20)  # room for arguments over ARG_MAX
    with TestClient(create_app(config, executor)) as client:
        token = (home / "admin.token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def stored(api: TestClient) -> list[dict]:
    return api.get("/api/v1/jobs", params={"limit": 500}).json()["items"]


def refused(api: TestClient, path: str, body: dict, want_field: str) -> list[dict]:
    """POST `body`; it must be a 422 whose detail names `want_field`, storing nothing."""
    before = len(stored(api)) if path == "/api/v1/jobs" else None
    r = api.post(path, json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list), detail
    assert any(e["loc"][:2] == ["body", want_field] for e in detail), detail
    assert all(e["msg"] for e in detail)
    if before is not None:
        assert len(stored(api)) == before
    return detail


def test_a_good_job_is_admitted(api: TestClient) -> None:
    r = api.post("/api/v1/jobs", json=GOOD)
    assert r.status_code == 201, r.text


BAD_JOBS = {
    "script missing": ({"script": "nope.py"}, "script", "does not exist"),
    "script absolute missing": ({"script": "/no/such/t.py"}, "script", "does not exist"),
    "script climbs out": ({"script": "../../../../etc/passwd"}, "script", "climbs out"),
    "script a directory": ({"script": "/etc"}, "script", "not a regular file"),
    "script neither .py nor executable": ({"script": PLAIN}, "script", "neither"),
    "workdir missing": ({"workdir": None}, "workdir", "required"),
    "workdir relative": ({"workdir": "scripts"}, "workdir", "relative"),
    "workdir absent": ({"workdir": "/no/such/dir"}, "workdir", "not a directory"),
    "one argument too long": ({"args": ["x" * MAX_ARG_STRLEN]}, "args", "at most"),
    "arguments over the spec's cap": (  # long before ARG_MAX
        {"args": ["y" * (MAX_ARG_STRLEN - 1)] * (os.sysconf("SC_ARG_MAX") // MAX_ARG_STRLEN + 1)},
        "args",
        "at most",
    ),
    "a NUL in an argument": ({"args": ["a\x00b"]}, "args", "NUL"),
}


@pytest.mark.parametrize(("change", "want_field", "want_msg"), BAD_JOBS.values(), ids=BAD_JOBS)
def test_a_job_that_can_never_run_is_refused_naming_the_field(
    api: TestClient, change: dict, want_field: str, want_msg: str, tmp_path: Path
) -> None:
    body = {k: v for k, v in (GOOD | change).items() if v is not None}
    if body["script"] == PLAIN:
        body["script"] = str(tmp_path / "notes.txt")
        (tmp_path / "notes.txt").write_text("not a program\n")
        (tmp_path / "notes.txt").chmod(0o644)
    detail = refused(api, "/api/v1/jobs", body, want_field)
    assert want_msg in detail[0]["msg"], detail


def test_a_script_the_jobs_user_cannot_read_is_refused() -> None:
    spec = JobSpec.model_validate(GOOD)
    errors = job_errors(spec, readable=lambda path: path == WORKDIR)  # the workdir only
    assert [e["loc"] for e in errors] == [["body", "script"]]
    assert "not readable by the user jobs run as" in errors[0]["msg"]
    errors = job_errors(spec, readable=lambda path: False)  # each problem is listed
    assert [e["loc"] for e in errors] == [["body", "workdir"], ["body", "script"]]


def test_an_executable_without_py_is_admitted(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    spec = JobSpec(name="sh", script="run.sh", workdir=str(tmp_path))
    assert job_errors(spec) != []  # not executable yet
    script.chmod(0o755)
    assert job_errors(spec) == []


BAD_SERVICES = {
    "unknown engine": ({"engine": "tensorrt"}, "engine", "engine 'tensorrt'; known: "),
    "unknown speculative": ({"speculative": "bogus"}, "speculative", "proposer 'bogus'; known: "),
    "replicas as bool": ({"replicas": True}, "replicas", "valid integer"),
    "threads as float": ({"threads": 1.0}, "threads", "valid integer"),
    "model as number": ({"model": 135}, "model", "valid string"),
}


@pytest.mark.parametrize(
    ("change", "want_field", "want_msg"), BAD_SERVICES.values(), ids=BAD_SERVICES
)
def test_a_service_that_can_never_run_is_refused_naming_the_field(
    api: TestClient, change: dict, want_field: str, want_msg: str
) -> None:
    before = api.get("/api/v1/services").json()["items"]
    detail = refused(api, "/api/v1/services", {"name": "s"} | change, want_field)
    assert want_msg in detail[0]["msg"], detail
    assert api.get("/api/v1/services").json()["items"] == before


STRICT = {
    "nproc_per_node bool": ({"nproc_per_node": True}, "nproc_per_node"),
    "nproc_per_node float": ({"nproc_per_node": 1.0}, "nproc_per_node"),
    "nproc_per_node text": ({"nproc_per_node": "2"}, "nproc_per_node"),
    "priority bool": ({"priority": False}, "priority"),
    "name number": ({"name": 7}, "name"),
    "queue bool": ({"queue": True}, "queue"),
    "arg bool": ({"args": [True]}, "args"),
    "elastic max float": (
        {"elastic": {"min_nnodes": 1, "max_nnodes": 2.0}},
        "elastic",
    ),
}


@pytest.mark.parametrize(("change", "want_field"), STRICT.values(), ids=STRICT)
def test_values_of_the_wrong_type_are_refused_not_coerced(
    api: TestClient, change: dict, want_field: str
) -> None:
    refused(api, "/api/v1/jobs", GOOD | change, want_field)


def test_numbers_in_args_still_become_text(api: TestClient) -> None:
    r = api.post("/api/v1/jobs", json=GOOD | {"args": ["--steps", 60, "--lr", 0.5]})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["args"] == ["--steps", "60", "--lr", "0.5"]


INT_FIELDS = ("nproc_per_node", "nnodes", "max_restarts", "priority", "checkpoint_every")
STR_FIELDS = ("name", "queue", "script", "workdir")
confused = st.one_of(
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**70), 2**70),
    st.text(max_size=12),
    st.none(),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(changes=st.dictionaries(st.sampled_from(INT_FIELDS + STR_FIELDS), confused, min_size=1))
def test_type_confused_bodies_never_5xx_and_nothing_coerced_is_stored(
    api: TestClient, changes: dict
) -> None:
    r = api.post("/api/v1/jobs", json=GOOD | changes)
    assert r.status_code in (201, 422), r.text
    if r.status_code == 422:
        return
    spec = r.json()["spec"]
    for field, value in changes.items():
        if value is None and field in ("workdir", "checkpoint_every"):
            continue  # None is a valid value there (workdir then fails admission: not here)
        want_type = int if field in INT_FIELDS else str
        assert type(value) is want_type, (field, value)  # only exact types get in
        assert spec[field] == value
