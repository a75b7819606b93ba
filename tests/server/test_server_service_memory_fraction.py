"""A service's `memory_fraction` through the API: bad values are a 422 naming the field,
a good one reaches each replica's `argosy serve --memory-fraction` (where the node's device
ledger refuses a share that would push the device's sum over 1.0)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import fast_config

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.service_spec import ServiceSpec
from argosy.server.services import serve_command


@pytest.fixture
def api(home: Path) -> Iterator[TestClient]:
    fake = FakeExecutor([NodeInfo("n0", "cpu", 1)])
    with TestClient(create_app(fast_config(home), executor=fake)) as c:
        c.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        yield c


@pytest.mark.parametrize("bad", [0, -0.5, 1.2, "half", [0.5]])
def test_bad_memory_fraction_is_a_422_naming_the_field(api: TestClient, bad: object) -> None:
    body = {"name": "chat", "model": "smollm2-135m", "memory_fraction": bad}
    response = api.post("/api/v1/services", json=body)
    assert response.status_code == 422, response.text
    assert any(e["loc"][-1] == "memory_fraction" for e in response.json()["detail"])


def test_memory_fraction_reaches_the_replica_command() -> None:
    spec = ServiceSpec(name="chat", memory_fraction=0.4)
    command = serve_command(spec, "127.0.0.1", 9000)
    assert command[command.index("--memory-fraction") + 1] == "0.4"
    assert "--memory-fraction" not in serve_command(ServiceSpec(name="chat"), "h", 1)
