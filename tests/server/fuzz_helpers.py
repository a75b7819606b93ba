"""Fuzzing /api/v1 with schemathesis, stateless and stateful, against a real server: what
the CI test (test_server_stateful.py) and the benchmark (benchmarks/api_fuzz.py) share.

    server, principals = start_fuzz_server(root)
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    tally = Tally()
    run_stateless(schema, principals, tally, max_examples=5)
    run_stateful(schema, principals, tally, scenarios=20, steps=10)
    print(tally.summary(len(operations(schema))))

The server has two tenant queues, team-a and team-b, each with a ceiling of 0 devices:
a job or service the fuzzer gets accepted is stored, then fails at once as one that can
never run, so nothing is ever started whatever the fuzzer does to the node (cordon,
uncordon, health verdicts). Requests alternate between the admin's token and team-a's,
so sequences cross tenants (the admin creates in team-b, team-a tries to cancel it).

To get past admission (a script that exists, an absolute workdir, a known engine), half
of the generated job and service bodies that are objects get a valid script, workdir,
engine and the caller's queue before they are sent; the other half go as generated.
The stateful links between operations (create a job, then read, cancel, list its
events) are schemathesis' own inference from the OpenAPI schema.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import hypothesis.errors
import schemathesis
from hypothesis.errors import Unsatisfiable
from schemathesis import checks
from schemathesis.core.failures import FailureGroup
from server_helpers import STEPS, WORKDIR, ServerProcess

CHECKS = [  # semantic 4xx (an unknown queue, another tenant's job) are answers, not failures
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]
QUEUES = """queues:
  - name: org
    children:
      - name: team-a
        quota: {cpu: {ceiling: 0}}
      - name: team-b
        quota: {cpu: {ceiling: 0}}
"""
QUEUE_OF = {"admin": "team-b", "team-a": "team-a"}
"""The queue a fixed-up body names, by caller."""


@dataclass
class Principals:
    """The admin's token and team-a's, and which of them sends the next request. The
    fuzzer may revoke team-a's token (the admin lists tokens and deletes them): a new
    one is made when a scenario starts."""

    url: str
    admin: str
    team_a: str = ""
    turn: int = 0

    def refresh(self) -> None:
        """A live team-a token (a new one if the fuzzer revoked the last)."""
        headers = {"Authorization": f"Bearer {self.team_a}"}
        if (
            self.team_a
            and httpx.get(f"{self.url}/api/v1/queues", headers=headers).status_code == 200
        ):
            return
        r = httpx.post(
            f"{self.url}/api/v1/tokens",
            json={"queue": "team-a", "name": "fuzz-team-a"},
            headers={"Authorization": f"Bearer {self.admin}"},
        )
        assert r.status_code == 201, r.text
        self.team_a = r.json()["token"]

    def next(self) -> str:
        self.turn += 1
        return "admin" if self.turn % 2 else "team-a"

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin if who == 'admin' else self.team_a}"}


@dataclass
class Tally:
    """What the fuzzing sent and what broke."""

    requests: int = 0
    by_operation: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    """curl commands of the requests answered 5xx."""
    violations: Counter[str] = field(default_factory=Counter)
    """Failed checks by title (the 5xx check included)."""
    examples: dict[str, str] = field(default_factory=dict)
    """One curl command per failed check title."""
    restarts: int = 0
    """Stateful runs cut short by Hypothesis' replay check (the server's state moved on)."""

    def record(self, case: schemathesis.Case, status: int) -> None:
        self.requests += 1
        self.by_operation[case.operation.label] += 1
        self.statuses[status] += 1
        if status >= 500:
            self.server_errors.append(case.as_curl_command())

    def record_failures(self, case: schemathesis.Case, group: FailureGroup) -> None:
        for failure in group.exceptions:
            self.violations[failure.title] += 1
            self.examples.setdefault(failure.title, f"{case.as_curl_command()}\n{failure.message}")

    def summary(self, operations: int) -> dict[str, Any]:
        return {
            "operations_covered": len(self.by_operation),
            "operations_total": operations,
            "requests": self.requests,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "server_errors": len(self.server_errors),
            "schema_violations": sum(
                v for k, v in self.violations.items() if "Server error" not in k
            ),
            "violations_by_check": dict(self.violations),
        }


def start_fuzz_server(root: Path) -> tuple[ServerProcess, Principals]:
    """A server on the fuzzing queue tree, and the principals that call it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "queues.yaml").write_text(QUEUES)
    server = ServerProcess(root / "home", "--queues", str(root / "queues.yaml"))
    server.start()
    principals = Principals(server.url, (server.home / "admin.token").read_text().strip())
    principals.refresh()
    return server, principals


def fix_up(case: schemathesis.Case, who: str) -> None:
    """Half of the object bodies of job and service creation get what admission needs
    (chosen by a hash of the body, so a run is reproducible from its seed)."""
    body = case.body
    if case.method != "POST" or not isinstance(body, dict):
        return
    if zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode()) % 2:
        return
    if case.path == "/api/v1/jobs":
        body.update(script=STEPS, workdir=WORKDIR, queue=QUEUE_OF[who])
    elif case.path == "/api/v1/services":
        body.update(engine="transformers", speculative="auto", queue=QUEUE_OF[who])


def call(case: schemathesis.Case, who: str, principals: Principals, tally: Tally) -> None:
    """Send the case as `who`, record it and what its checks found."""
    fix_up(case, who)
    response = case.call(headers=principals.headers(who), timeout=60)
    tally.record(case, response.status_code)
    validate(case, response, tally)


def validate(case: schemathesis.Case, response: Any, tally: Tally) -> None:
    """Run the checks; failures are recorded, not raised (a run goes on past them)."""
    try:
        case.validate_response(response, checks=CHECKS)
    except FailureGroup as group:
        tally.record_failures(case, group)


def operations(schema: Any) -> list[schemathesis.APIOperation]:
    return [result.ok() for result in schema.get_all_operations()]


def run_stateless(schema: Any, principals: Principals, tally: Tally, max_examples: int) -> None:
    """Every operation, with data valid by the schema and data that breaks it, as the
    admin and as team-a: `max_examples` cases each."""
    for operation in operations(schema):
        for mode in schemathesis.GenerationMode:
            for who in QUEUE_OF:
                fuzz_operation(operation, mode, who, principals, tally, max_examples)


def fuzz_operation(  # noqa: PLR0913
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    who: str,
    principals: Principals,
    tally: Tally,
    max_examples: int,
) -> None:
    """`max_examples` cases of one operation in one generation mode, sent as `who`."""

    @hypothesis.given(case=operation.as_strategy(mode))
    @hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        database=None,
        phases=[hypothesis.Phase.generate],
    )
    def run(case: schemathesis.Case) -> None:
        call(case, who, principals, tally)

    try:
        run()
    except Unsatisfiable:  # an operation without inputs has no invalid input to send
        assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label


def run_stateful(
    schema: Any, principals: Principals, tally: Tally, scenarios: int, steps: int
) -> int:
    """At least `scenarios` sequences of up to `steps` linked calls (schemathesis' state
    machine over the links it infers), alternating the admin's token and team-a's;
    returns how many ran. Checks are recorded in `tally`, never raised inside the
    machine: the server's state outlives each scenario, so a replay by Hypothesis draws
    differently (`Flaky`), and a run that hits that is simply followed by a new one,
    as schemathesis' own engine does."""
    base = schema.as_state_machine()
    done = 0

    class Machine(base):  # type: ignore[misc, valid-type]  # a class made at run time
        who = "admin"

        def setup(self) -> None:
            principals.refresh()

        def teardown(self) -> None:
            nonlocal done
            done += 1

        def before_call(self, case: schemathesis.Case) -> None:
            self.who = principals.next()
            fix_up(case, self.who)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": principals.headers(self.who), "timeout": 60}

        def after_call(self, response: Any, case: schemathesis.Case) -> None:
            tally.record(case, response.status_code)

        def validate_response(
            self, response: Any, case: schemathesis.Case, *_: Any, **__: Any
        ) -> None:
            validate(case, response, tally)

    settings = hypothesis.settings(
        max_examples=scenarios,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        database=None,
        phases=[hypothesis.Phase.generate],
    )
    while done < scenarios:
        try:
            Machine.run(settings=settings)
        except hypothesis.errors.Flaky:
            tally.restarts += 1
        except AssertionError as err:  # Hypothesis' own check that a replay drew the same
            if "hypothesis" not in traceback_module(err):
                raise
            tally.restarts += 1
    return done


def traceback_module(err: BaseException) -> str:
    """The module of the innermost frame that raised `err`."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "" if tb is None else str(tb.tb_frame.f_globals.get("__name__", ""))


def nothing_ran(server: ServerProcess) -> list[dict]:
    """Jobs that ever started (none should: the queues' ceilings are 0)."""
    with server.client() as c:
        jobs, cursor = [], 0
        while cursor is not None:
            page = c.get("/api/v1/jobs", params={"limit": 500, "cursor": cursor}).json()
            jobs += page["items"]
            cursor = page["next_cursor"]
    return [j for j in jobs if j["attempts"] or j["started_at"]]
