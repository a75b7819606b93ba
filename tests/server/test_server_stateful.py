"""Stateful property test of the REST API (schemathesis' state machine over the links it
infers from the OpenAPI schema): sequences of linked calls (create a job, read it,
cancel it, list its events; create a token, revoke it; cordon a node, report on it)
alternating the admin's token and a queue token. No answer may be a 5xx, and every
answer must match the status codes, content types, headers and bodies the schema
declares. (The stateless run over every operation: test_server_schema.py; the same
fuzzing for minutes: benchmarks/api_fuzz.py.)

The server's two queues have a ceiling of 0 devices, so what the fuzzer gets accepted
is stored and fails as never runnable: nothing starts (tests/server/fuzz_helpers.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from fuzz_helpers import Principals, Tally, nothing_ran, operations, run_stateful, start_fuzz_server
from server_helpers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCENARIOS, STEPS = 50, 10
"""About 450 requests, 10 s on the shared 2-core VM."""


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Principals]]:
    server, principals = start_fuzz_server(tmp_path_factory.mktemp("stateful"))
    yield server, principals
    server.kill()


def test_linked_calls_never_5xx_and_match_the_schema(fuzzed) -> None:
    server, principals = fuzzed
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    tally = Tally()
    ran = run_stateful(schema, principals, tally, scenarios=SCENARIOS, steps=STEPS)
    summary = tally.summary(len(operations(schema)))
    assert summary["server_errors"] == 0 and summary["schema_violations"] == 0, tally.examples
    assert ran >= SCENARIOS and tally.requests >= 2 * SCENARIOS, summary
    linked = {"GET /api/v1/jobs/{job_id}", "POST /api/v1/jobs/{job_id}/cancel"}
    assert linked <= set(tally.by_operation), summary  # the links were followed
    assert summary["operations_covered"] >= 15, summary


def test_nothing_the_fuzzer_submitted_ever_ran(fuzzed) -> None:
    server, _ = fuzzed
    assert nothing_ran(server) == []
    log = (server.home.parent / f"server-{server.port}.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert httpx.get(f"{server.url}/api/v1/health").json() == {"status": "ok"}
