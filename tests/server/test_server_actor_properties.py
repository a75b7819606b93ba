"""Property test of the audit trail (hypothesis state machine over the REST API, a real
store and control loop, a fake executor): random submits, cancels, cordons, token
creates and revokes, service creates and deletes, each by the server's admin token, an
admin token made through the API, or a queue token (some of them revoked).

After every step:
- every event names a non-empty actor;
- each event a request caused names that request's actor (`admin` or
  `token <id> (<name>)`); the `cancelled` and `deleted` events the control loop writes
  when a stop completes name an actor that asked for it;
- every other event (admitted, running, replica_started, ...) is the system's;
- a revoked token's requests are 401 and cause nothing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from server_helpers import fast_config, job_body

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app

NODES = [NodeInfo("n0", "cpu", 2), NodeInfo("n1", "cpu", 2)]
SERVICE = {"name": "chat", "replicas": 1, "model": "smollm2-135m", "queue": "default"}
PICK = st.integers(0, 1000)  # an index into a list that grows: stable under replay


@dataclass
class Caller:
    token: str
    actor: str
    token_id: str = ""
    queue: str | None = None
    revoked: bool = False


class AuditMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        home = Path(self.tmp.name) / "home"
        config = fast_config(home, poll_interval_s=0.01, cycle_interval_s=0.05)
        self.client = TestClient(create_app(config, executor=FakeExecutor(NODES)))
        self.client.__enter__()
        admin = (home / "admin.token").read_text().strip()
        self.admin = Caller(admin, "admin")
        self.callers = [self.admin]
        self.jobs: list[str] = []
        self.services: list[str] = []
        self.cancellers: dict[str, set[str]] = {}
        self.deleters: dict[str, set[str]] = {}
        self.cursor = 0

    def teardown(self) -> None:
        self.client.__exit__(None, None, None)
        self.tmp.cleanup()

    # ---- requests ---------------------------------------------------------------------
    def call(self, caller: Caller, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Authorization": f"Bearer {caller.token}"}
        r = self.client.request(method, path, json=body, headers=headers)
        if caller.revoked:
            assert r.status_code == 401, (caller, r.text)
        return {"status": r.status_code, "body": r.json() if r.content else None}

    def pick(self, index: int) -> Caller:
        return self.callers[index % len(self.callers)]

    @rule(by=PICK, admin_token=st.booleans(), name=st.sampled_from(["", "ci", "ops team"]))
    def create_token(self, by: int, admin_token: bool, name: str) -> None:
        caller = self.pick(by)
        body = {"queue": None if admin_token else "default", "name": name}
        r = self.call(caller, "POST", "/api/v1/tokens", body)
        if r["status"] == 201:
            made = r["body"]
            actor = f"token {made['id']} ({name})" if name else f"token {made['id']}"
            self.callers.append(Caller(made["token"], actor, made["id"], body["queue"]))
            self.settle(caller, {(None, "token_created")})
        else:
            assert caller.revoked or caller.queue is not None
            self.settle(None, set())

    @precondition(lambda self: len(self.callers) > 1)
    @rule(by=PICK, which=PICK)
    def revoke_token(self, by: int, which: int) -> None:
        caller, victim = self.pick(by), self.callers[1 + which % (len(self.callers) - 1)]
        r = self.call(caller, "DELETE", f"/api/v1/tokens/{victim.token_id}")
        if r["status"] == 200:
            self.settle(caller, {(None, "token_revoked")})  # it may have revoked itself
            victim.revoked = True
        else:
            self.settle(None, set())

    @rule(by=PICK)
    def submit(self, by: int) -> None:
        caller = self.pick(by)
        r = self.call(caller, "POST", "/api/v1/jobs", job_body("p"))
        if r["status"] == 201:
            job_id = r["body"]["id"]
            self.jobs.append(job_id)
            self.settle(caller, {(job_id, "submitted"), (job_id, "rejected")})
        else:
            self.settle(None, set())

    @precondition(lambda self: self.jobs)
    @rule(by=PICK, which=PICK)
    def cancel(self, by: int, which: int) -> None:
        caller, job_id = self.pick(by), self.jobs[which % len(self.jobs)]
        if not caller.revoked:
            self.cancellers.setdefault(job_id, set()).add(caller.actor)
        self.call(caller, "POST", f"/api/v1/jobs/{job_id}/cancel")
        self.settle(caller, {(job_id, "cancel"), (job_id, "cancelled")})

    @rule(by=PICK, node=st.sampled_from(["n0", "n1"]), cordoned=st.booleans())
    def cordon(self, by: int, node: str, cordoned: bool) -> None:
        caller = self.pick(by)
        verb = "cordon" if cordoned else "uncordon"
        self.call(caller, "POST", f"/api/v1/nodes/{node}/{verb}")
        self.settle(caller, {(None, "cordoned"), (None, "uncordoned")})

    @rule(by=PICK)
    def create_service(self, by: int) -> None:
        caller = self.pick(by)
        r = self.call(caller, "POST", "/api/v1/services", SERVICE)
        if r["status"] == 201:
            service_id = r["body"]["id"]
            self.services.append(service_id)
            self.settle(caller, {(service_id, "submitted"), (service_id, "failed")})
        else:
            self.settle(None, set())

    @precondition(lambda self: self.services)
    @rule(by=PICK, which=PICK)
    def delete_service(self, by: int, which: int) -> None:
        caller, service_id = self.pick(by), self.services[which % len(self.services)]
        if not caller.revoked:
            self.deleters.setdefault(service_id, set()).add(caller.actor)
        self.call(caller, "DELETE", f"/api/v1/services/{service_id}")
        self.settle(caller, {(service_id, "delete"), (service_id, "deleted")})

    @rule()
    def the_loop_runs(self) -> None:
        import time

        time.sleep(0.05)  # admissions, starts, stops completing

    # ---- checks -----------------------------------------------------------------------
    def settle(self, caller: Caller | None, caused: set[tuple[str | None, str]]) -> None:
        """Check the events written since the last check; `caused` are the (subject,
        kind) pairs this request may have written, in the name of `caller`."""
        actor = None if caller is None or caller.revoked else caller.actor
        for event in self.new_events():
            self.check(event, actor, caused)

    def check(self, event: dict, actor: str | None, caused: set[tuple[str | None, str]]) -> None:
        assert event["actor"], event
        key = (event["job_id"], event["kind"])
        # a stop that completes names a request to stop, which may be an earlier caller's:
        # the loop can settle it just as a later caller asks again
        if event["kind"] == "cancelled" and event["job_id"] in self.cancellers:
            assert event["actor"] in self.cancellers[event["job_id"]], event
        elif event["kind"] == "deleted" and event["job_id"] in self.deleters:
            assert event["actor"] in self.deleters[event["job_id"]], event
        elif actor is not None and key in caused:
            assert event["actor"] == actor, (event, actor)
        else:
            assert event["actor"] == "system", (event, actor, caused)

    def new_events(self) -> list[dict]:
        out: list[dict] = []
        while True:
            params = {"cursor": self.cursor, "limit": 500}
            page = self.call(self.admin, "GET", "/api/v1/events?" + _query(params))["body"]
            out += page["items"]
            if page["items"]:
                self.cursor = page["items"][-1]["seq"]
            if page["next_cursor"] is None:
                return out

    @invariant()
    def every_event_names_its_actor(self) -> None:
        self.settle(None, set())


def _query(params: dict) -> str:
    return "&".join(f"{k}={v}" for k, v in params.items())


AuditMachine.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
test_every_event_names_the_actor_that_caused_it = AuditMachine.TestCase
