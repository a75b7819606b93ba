"""The access log: one line per request with method, path (no query values), status,
actor and duration; its file is 0600 in a 0700 directory and rotates at its cap."""

from __future__ import annotations

import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import fast_config

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app

LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) (?P<method>[A-Z]+) (?P<path>\S+) "
    r'(?P<status>\d{3}) (?P<ms>\d+\.\d)ms "(?P<actor>[^"]*)"$'
)


@pytest.fixture
def api(home: Path) -> Iterator[TestClient]:
    config = fast_config(home, access_log_max_bytes=4096, access_log_backups=2)
    with TestClient(create_app(config, executor=FakeExecutor([NodeInfo("n0", "cpu", 2)]))) as c:
        c.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        yield c


def lines(home: Path) -> list[dict[str, str]]:
    text = (home / "logs" / "access.log").read_text()
    out = []
    for line in text.splitlines():
        match = LINE.match(line)
        assert match, line
        out.append(match.groupdict())
    return out


def test_each_request_is_one_line_naming_its_actor_and_status(api: TestClient, home: Path) -> None:
    token = api.post("/api/v1/tokens", json={"queue": "default", "name": "ci"}).json()
    user = {"Authorization": f"Bearer {token['token']}"}
    api.get("/api/v1/jobs", params={"state": "pending", "queue": "secret-value"}, headers=user)
    api.get("/api/v1/jobs", headers={"Authorization": "Bearer wrong"})
    api.post("/api/v1/nodes/n0/cordon", headers=user)
    api.get("/api/v1/health", headers={"Authorization": ""})
    got = [(x["method"], x["path"], x["status"], x["actor"]) for x in lines(home)]
    want_actor = f"token {token['id']} (ci)"
    assert got == [
        ("POST", "/api/v1/tokens", "201", "admin"),
        ("GET", "/api/v1/jobs?state&queue", "200", want_actor),
        ("GET", "/api/v1/jobs", "401", "-"),
        ("POST", "/api/v1/nodes/n0/cordon", "403", want_actor),
        ("GET", "/api/v1/health", "200", "-"),
    ]
    assert "secret-value" not in (home / "logs" / "access.log").read_text()


def test_the_log_is_private(api: TestClient, home: Path) -> None:
    api.get("/api/v1/jobs")
    assert stat.S_IMODE((home / "logs").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "logs" / "access.log").stat().st_mode) == 0o600


def test_the_log_rotates_at_its_cap_and_keeps_its_backups(api: TestClient, home: Path) -> None:
    for _ in range(300):  # ~80 bytes a line: several times the 4 KiB cap
        api.get("/api/v1/health")
    files = sorted(p.name for p in (home / "logs").iterdir())
    assert files == ["access.log", "access.log.1", "access.log.2"]
    for p in (home / "logs").iterdir():
        assert p.stat().st_size <= 4096
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert all(x["path"] == "/api/v1/health" for x in lines(home))


def test_a_forged_line_break_or_quote_stays_on_its_line(api: TestClient, home: Path) -> None:
    api.get('/api/v1/jobs/x%0A2025-01-01T00:00:00.000Z GET /evil 200 1.0ms "admin"')
    api.get('/api/v1/jobs/"quoted"')
    assert len(lines(home)) == 2
