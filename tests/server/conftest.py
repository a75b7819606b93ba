"""Fixtures of the server tests: an app on a temporary home with its admin token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import NODES, app_client, fast_config

from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    with TestClient(create_app(fast_config(home))) as c:
        token = (home / "admin.token").read_text().strip()
        c.headers["Authorization"] = f"Bearer {token}"
        yield c


@pytest.fixture
def fake() -> FakeExecutor:
    """The executor of the `api` server: attempts end when a test says (two 2-device nodes)."""
    return FakeExecutor(NODES)


@pytest.fixture
def api(home: Path, fake: FakeExecutor) -> Iterator[TestClient]:
    """A server over `fake`, with its admin token."""
    with app_client(home, fake) as c:
        c.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        yield c
