"""Property tests of the REST API against its own OpenAPI schema (schemathesis): whatever
a client sends, valid by the schema or not, the server never answers 5xx, and every
answer matches the schema it declares.

The server is a real process whose only node is cordoned, so generated jobs are stored
and queued but never started.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import checks
from server_helpers import ServerProcess

CHECKS = [  # semantic 422s (an unknown queue) are answers, not failures
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path_factory.mktemp("schema") / "home")
    s.start()
    with s.client() as c:
        node = c.get("/api/v1/nodes").json()[0]["name"]
        assert c.post(f"/api/v1/nodes/{node}/cordon").status_code == 200
    yield s
    s.kill()


def test_no_server_errors_and_answers_match_the_schema(server: ServerProcess) -> None:
    api = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    token = (server.home / "admin.token").read_text().strip()
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:
        for mode in schemathesis.GenerationMode:  # valid data, and data that breaks it
            check_operation(operation, mode, token)


def check_operation(
    operation: schemathesis.APIOperation, mode: schemathesis.GenerationMode, token: str
) -> None:
    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def run(case: schemathesis.Case) -> None:
        response = case.call(headers={"Authorization": f"Bearer {token}"})
        assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
        case.validate_response(response, checks=CHECKS)

    try:
        run()
    except Unsatisfiable:  # an operation without inputs has no invalid input to send
        assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label


def test_generated_jobs_were_stored_not_started(server: ServerProcess) -> None:
    with server.client() as c:
        states = {j["state"] for j in c.get("/api/v1/jobs", params={"limit": 500}).json()["items"]}
    assert states <= {"pending", "cancelled"}
    assert httpx.get(f"{server.url}/api/v1/health").json() == {"status": "ok"}
