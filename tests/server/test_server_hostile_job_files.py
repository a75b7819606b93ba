"""What a job writes cannot stop, poison or steer the control plane.

A job's `summary.json` and `node_health.json` are the tenant's writing (the launcher runs
as the job's user, and the job can keep it from writing its own). Whatever they hold, the
job ends with a state, other tenants' jobs still run, every answer stays strict JSON, and
the node's record moves only as far as a run's own word may take it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import NODES, STEPS, WORKDIR

from argosy.executors.fake import FakeExecutor
from argosy.server.job_json import loads_job_json

HOSTILE_SUMMARIES = [
    '{"status": "completed", "nodes": [1]}',
    '{"status": "completed", "nodes": [{"node": "victim-gpu-node", "energy_j": 9e15}]}',
    '{"status": "completed", "throughput": {"tokens_per_s": Infinity}}',
    '{"status": "completed", "wall_s": NaN, "energy": {"measured": true, "devices": [1]}}',
    '{"status": "completed", "lost_s": {"a": "x", "b": 1e999}}',
    '{"status": "completed", "energy": {"measured": true, "devices": {"0": 5}}}',
    '{"status": "completed", "final_step": ' + "9" * 400 + "}",
    "[" * 50_000 + "]" * 50_000,
    '{"status": "completed", "faults": "many", "cause": [1, 2]}',
    '{"status": "completed", "effective_training_time": "all of it"}',
    '{"status": "completed", "effective_training_time": 1e300}',
    '{"status": "completed", "effective_training_time": -5, "restarts": "x"}',
    '{"status": "completed", "effective_training_time": {"a": 1}, "final_step": [1]}',
    '{"status": "completed", "wall_s": 10, "effective_training_time": "x", "productive_s": [],'
    ' "lost_s": ["a"], "faults": 3, "energy": {"measured": true, "total_j": "lots",'
    ' "lost_j": {"a": "b"}, "devices": {"gpu0": {"energy_j": "x"}, "gpu1": 7}}}',
    '{"status": "completed", "wall_s": 10, "lost_s": {"a": {"b": 1}}, "energy": {"measured":'
    ' true, "devices": ["gpu0"], "joules_per_step": "x", "tokens_per_joule": [1]}}',
    '{"status": "completed", "productive_s": 1e300, "final_step": 1e300, "resumed_from": -1,'
    ' "step_s": 1e300, "restarts": 1e300, "span_s": [0, 1e12], "job": {"wall_s": 1e9}}',
    '{"status": "completed", "productive_s": "x", "resumed_from": [1], "step_s": NaN,'
    ' "lost_s": {"startup": 1e300, "redone": -7}}',
]


def _strict(text: str) -> object:
    """json.loads that refuses what browsers and SQLite refuse."""

    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} in an answer")

    return json.loads(text, parse_constant=refuse)


def _start(api: TestClient, fake: FakeExecutor, name: str = "j") -> tuple[str, object]:
    body = {"name": name, "script": STEPS, "workdir": WORKDIR, "max_restarts": 0}
    job_id = api.post("/api/v1/jobs", json=body).json()["id"]
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while job_id not in fake.running:
        assert time.monotonic() < deadline, "the job was not placed"
        time.sleep(0.02)
    request = fake.running[job_id]
    request.run_dir.mkdir(parents=True, exist_ok=True)
    return job_id, request


def _login(api: TestClient, token: str) -> None:
    """A console session for `api`, through the login form as a browser gets one."""
    r = api.post("/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text[:300]


def _ended(api: TestClient, job_id: str) -> dict:
    deadline = time.monotonic() + 60
    while (job := api.get(f"/api/v1/jobs/{job_id}").json())["state"] not in (
        "succeeded",
        "failed",
    ):
        assert time.monotonic() < deadline, f"the job did not end: {job}"
        time.sleep(0.02)
    return job


@pytest.mark.parametrize("text", HOSTILE_SUMMARIES)
def test_a_hostile_summary_ends_its_job_and_everyone_else_goes_on(
    api: TestClient, fake: FakeExecutor, text: str
) -> None:
    job_id, request = _start(api, fake, "hostile")
    (request.run_dir / "summary.json").write_text(text)
    fake.finish(job_id, 0)
    job = _ended(api, job_id)
    summary = job["summary"]
    assert summary["attempt"] == 1
    assert "victim-gpu-node" not in json.dumps(summary)  # nodes are the server's to name
    account = summary["job"]  # the server's: over its own clock, not the job's word
    assert summary["span_s"] != [0, 1e12] and account["wall_s"] != 1e9
    assert 0.0 <= account["effective_training_time"] <= 1.0
    assert account["productive_s"] <= account["wall_s"]
    other, _ = _start(api, fake, "victim")  # the loop still places other tenants' work
    fake.finish(other, 0)
    assert _ended(api, other)["state"] == "succeeded"
    for path in ("/api/v1/jobs", f"/api/v1/jobs/{job_id}", "/api/v1/energy", "/metrics"):
        r = api.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        if path != "/metrics":
            _strict(r.text)
    energy = api.get("/api/v1/energy").json()
    assert "victim-gpu-node" not in json.dumps(energy)
    ett = [line for line in api.get("/metrics").text.splitlines()
           if line.startswith("argosy_effective_training_time ")]  # fmt: skip
    assert ett and 0.0 <= float(ett[0].split()[1]) <= 1.0, ett  # a fleet mean, whatever it said
    token = api.headers.pop("Authorization").removeprefix("Bearer ")
    _login(api, token)  # the console's pages of it, as a browser gets them
    for path in ("/", "/jobs", f"/jobs/{job_id}", f"/jobs/{job_id}/live"):
        r = api.get(path)
        assert r.status_code == 200, (path, r.text[-500:])


def test_the_account_over_attempts_is_on_the_job_s_page_and_in_the_fleet_mean(
    api: TestClient, fake: FakeExecutor
) -> None:
    """A job whose first attempt vanished: its page and the fleet's mean show the job over
    both attempts, not the last attempt's own (higher) figure."""
    body = {"name": "twice", "script": STEPS, "workdir": WORKDIR, "max_restarts": 1}
    job_id = api.post("/api/v1/jobs", json=body).json()["id"]
    figures = {"productive_s": 0.5, "wall_s": 0.5, "final_step": 20, "resumed_from": 10,
               "effective_training_time": 1.0, "restarts": 0}  # fmt: skip
    for attempt, code in ((1, None), (2, 0)):
        deadline = time.monotonic() + 60
        while job_id not in fake.running or fake.running[job_id].attempt != attempt:
            assert time.monotonic() < deadline, f"attempt {attempt} was not started"
            time.sleep(0.02)
        run_dir = fake.running[job_id].run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        if attempt == 2:
            time.sleep(0.6)  # the attempt lasts longer than the steps it reports
            (run_dir / "summary.json").write_text(json.dumps({"status": "completed"} | figures))
        fake.finish(job_id, code)
    job = _ended(api, job_id)
    account = job["summary"]["job"]
    assert account["attempts"] == 2 and account["estimated"] == [1]
    assert account["effective_training_time"] < 1.0 == job["summary"]["effective_training_time"]
    mean = [line for line in api.get("/metrics").text.splitlines()
            if line.startswith("argosy_effective_training_time ")]  # fmt: skip
    assert float(mean[0].split()[1]) == pytest.approx(account["effective_training_time"])
    _login(api, api.headers.pop("Authorization").removeprefix("Bearer "))
    page = api.get(f"/jobs/{job_id}/live").text
    assert "Over all 2 attempts" in page and 'id="goodput-job"' in page
    assert (
        "attempt 1 left neither a summary nor its event log" in page
    )  # its figures are an estimate, and say so
    assert f"{account['effective_training_time'] * 100:.1f}%" in page


def test_a_fault_while_taking_an_exit_fails_that_job_only(
    api: TestClient, fake: FakeExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever breaks while the server takes in an attempt's exit, that job fails with
    the reason and the control loop goes on for every other job."""
    from argosy.server import energy

    job_id, _ = _start(api, fake, "breaks")
    real = energy.EnergyLedger.record_attempt

    def broken(self, job: str, *args: object, **kw: object) -> None:
        if job == job_id:
            raise AttributeError("'int' object has no attribute 'get'")
        return real(self, job, *args, **kw)

    monkeypatch.setattr(energy.EnergyLedger, "record_attempt", broken)
    fake.finish(job_id, 0)
    job = _ended(api, job_id)
    assert job["state"] == "failed" and "could not take in" in job["reason"]
    other, _ = _start(api, fake, "after")
    fake.finish(other, 0)
    assert _ended(api, other)["state"] == "succeeded"


def test_the_ranks_last_lines_stay_out_of_what_every_token_reads(
    api: TestClient, fake: FakeExecutor, home: Path
) -> None:
    job_id, request = _start(api, fake)
    secret = "RuntimeError: db password is hunter2"
    summary = {
        "status": "failed",
        "cause": {"detail": "rank 0 crashed", "last_lines": {"0": [secret]}},
        "faults": [{"kind": "crash", "rank": 0, "last_lines": [secret]}],
    }
    (request.run_dir / "summary.json").write_text(json.dumps(summary))
    fake.finish(job_id, 1)
    job = _ended(api, job_id)
    assert secret not in json.dumps(job["summary"]) and secret not in job["reason"]
    assert job["summary"]["cause"]["detail"] == "rank 0 crashed"
    assert secret not in api.get("/api/v1/jobs").text
    kept = (request.run_dir / "server" / "attempt1" / "summary.json").read_text()
    assert secret in kept  # root's own copy keeps them


def _node_after(api: TestClient, fake: FakeExecutor, evidence: object) -> tuple[str, dict]:
    job_id, request = _start(api, fake)
    (request.run_dir / "node_health.json").write_text(json.dumps({"evidence": evidence}))
    fake.finish(job_id, 1)
    _ended(api, job_id)
    node = next(iter(request.nodes))
    return node, api.get(f"/api/v1/nodes/{node}").json()


def test_a_run_cannot_repair_or_vouch_for_its_node(api: TestClient, fake: FakeExecutor) -> None:
    now = time.time()
    friendly = [{"kind": k, "at_s": now, "detail": "all good"} for k in ("repair", "check_healthy")]
    node, detail = _node_after(api, fake, friendly)
    assert detail["history"] == []
    r = api.post(f"/api/v1/nodes/{node}/health", json={"verdict": "failed", "detail": "ecc"})
    assert r.status_code == 200 and not api.get(f"/api/v1/nodes/{node}").json()["in_service"]
    job_id, request = _start(api, fake)  # on the other node: the first is out of service
    where = next(iter(request.nodes))
    assert where != node
    evidence = {"evidence": [{"kind": "repair", "at_s": time.time()}]}
    (request.run_dir / "node_health.json").write_text(json.dumps(evidence))
    fake.finish(job_id, 1)
    _ended(api, job_id)
    assert api.get(f"/api/v1/nodes/{node}").json()["health"] == "quarantined"


def test_one_attempts_own_word_does_not_cordon_its_node_and_names_the_job(
    api: TestClient, fake: FakeExecutor
) -> None:
    now = time.time()
    evidence = [{"kind": "check_failed", "at_s": now, "detail": "preflight: gemm x0.1"}] * 5
    node, detail = _node_after(api, fake, evidence)
    assert detail["health"] == "healthy" and detail["in_service"]
    assert len(detail["history"]) == 1
    assert all("reported by job" in h["detail"] for h in detail["history"])


def test_a_flood_of_evidence_counts_a_bounded_few(api: TestClient, fake: FakeExecutor) -> None:
    from argosy.server.node_health import MAX_RUN_EVIDENCE

    now = time.time()
    evidence = [{"kind": "straggler", "at_s": now, "detail": "x" * 10_000}] * 20
    evidence += [{"kind": "straggler", "at_s": now}] * 10_000  # under the 1 MiB read
    _, detail = _node_after(api, fake, evidence)
    assert len(detail["history"]) == 1 < MAX_RUN_EVIDENCE  # one entry an attempt
    assert all(len(h["detail"]) < 400 for h in detail["history"])


def test_evidence_dated_outside_the_attempt_is_clamped_into_it(
    api: TestClient, fake: FakeExecutor
) -> None:
    """A run that dates its evidence far in the future cannot push the record's clock past
    every later check (which would then count for nothing)."""
    node, _ = _node_after(api, fake, [{"kind": "straggler", "at_s": 1e300}])
    r = api.post(f"/api/v1/nodes/{node}/health", json={"verdict": "failed", "detail": "real"})
    assert r.status_code == 200
    assert api.get(f"/api/v1/nodes/{node}").json()["health"] == "quarantined"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_a_job_json_value_is_taken_whole_and_finite_or_refused(value: object) -> None:
    text = json.dumps(value)  # Python writes NaN, Infinity and big integers as they are
    try:
        got = loads_job_json(text)
    except ValueError:
        assert not _finite(value)
        return
    assert _finite(value) and got == value


def _finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, list):
            return all(_finite(v) for v in value)
        if isinstance(value, dict):
            return all(_finite(v) for v in value.values())
        return True
    return -(1 << 63) <= value < (1 << 63)


def test_an_attempt_that_wrote_no_evidence_does_not_count_the_last_one_s_again(
    api: TestClient, fake: FakeExecutor
) -> None:
    """Attempt 1 reports one fault and is lost; attempt 2 (wherever it is placed) ends
    before its launcher writes anything: the file attempt 1 left counts once, against
    attempt 1's node, not again against attempt 2's."""
    body = {"name": "twice", "script": STEPS, "workdir": WORKDIR, "max_restarts": 3}
    job_id = api.post("/api/v1/jobs", json=body).json()["id"]
    for attempt in (1, 2):
        deadline = time.monotonic() + 60
        while (job_id, attempt) not in fake.started or job_id not in fake.running:
            assert time.monotonic() < deadline, f"attempt {attempt} never started"
            time.sleep(0.02)
        request = fake.running[job_id]
        if attempt == 1:
            request.run_dir.mkdir(parents=True, exist_ok=True)
            evidence = {"evidence": [{"kind": "fault", "at_s": time.time(), "detail": "stall"}]}
            (request.run_dir / "node_health.json").write_text(json.dumps(evidence))
        fake.finish(job_id, None)  # lost: requeued
    deadline = time.monotonic() + 60
    while api.get(f"/api/v1/jobs/{job_id}").json()["attempts"] < 3:
        assert time.monotonic() < deadline, "attempt 2's end was not taken"
        time.sleep(0.02)
    stalls = [
        h["detail"]
        for node in NODES
        for h in api.get(f"/api/v1/nodes/{node.name}").json()["history"]
        if "stall" in h["detail"]
    ]
    assert stalls == [f"stall (reported by job {job_id})"]
