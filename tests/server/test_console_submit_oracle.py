"""The console's submit form looks nothing up as the server's user: whether a file
exists where the job's user cannot look gives the same answer, and the form does not
show the server's working directory."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[TestClient]:
    config = ServerConfig(home=tmp_path / "home", cycle_interval_s=0.2)
    app = create_app(config, FakeExecutor([NodeInfo("n0", "cpu", 4)]))
    with TestClient(app) as client:
        token = (config.home / "admin.token").read_text().strip()
        client.post("/login", data={"token": token}, follow_redirects=False)
        page = client.get("/submit").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf, page[:300]
        client.headers["X-CSRF-Token"] = csrf.group(1)
        yield client


def _detail(client: TestClient, workdir: Path, script: str) -> str:
    form = {"name": "probe", "queue": "default", "script": script, "workdir": str(workdir)}
    r = client.post("/submit", data=form, follow_redirects=False)
    assert r.status_code == 422, r.text[:300]
    text = re.sub(r"<[^>]+>", " ", r.text)
    return text.replace(script, "NAME")


def test_a_file_the_job_user_cannot_reach_gives_the_same_answer_as_none(
    admin: TestClient, tmp_path: Path
) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "secret.py").write_text("print(1)\n")
    ctl = admin.app.state.control
    ctl.readable = lambda path: not str(path).startswith(str(hidden))  # the job's user
    there = _detail(admin, hidden, "secret.py")
    absent = _detail(admin, hidden, "absent.py")
    assert "workdir" in there
    assert there == absent


def test_the_form_does_not_show_the_servers_working_directory(admin: TestClient) -> None:
    page = admin.get("/submit").text
    assert f'value="{os.getcwd()}"' not in page


def test_a_form_without_a_workdir_names_the_field(admin: TestClient) -> None:
    form = {"name": "x", "queue": "default", "script": "/bin/true", "workdir": ""}
    r = admin.post("/submit", data=form, follow_redirects=False)
    assert r.status_code == 422 and "workdir" in r.text
