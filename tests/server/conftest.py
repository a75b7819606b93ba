"""Fixtures of the server tests: an app on a temporary home with its admin token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import fast_config

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
