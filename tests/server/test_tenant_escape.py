"""A queue token's job against a real root server: it tries every way we know to reach
the control plane's tokens or another tenant's files (environment, files, database,
/proc, shared memory, signals, links planted where the server reads) and must fail at
each; what the API serves of it never carries a token.

Needs root: only a root server runs jobs as other users (a non-root server runs them as
itself, and says so in docs/server.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import SCRIPTS, ServerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only under root"),
]
ESCAPE = str(SCRIPTS / "escape.py")
QUEUES = "queues:\n  - name: org\n    children:\n      - name: team-a\n      - name: team-b\n"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Path, dict[str, str]]]:
    """A root server whose home job users may pass through (a fresh temp dir), two queues,
    and a token for each."""
    root = Path(tempfile.mkdtemp(prefix="argosy-escape-", dir="/tmp"))
    home = root / "home"
    queues = root / "queues.yaml"
    queues.write_text(QUEUES)
    proc = ServerProcess(home, "--queues", str(queues))
    proc.root_jobs = False
    proc.start()
    admin = (home / "admin.token").read_text().strip()
    tokens = {"admin": admin}
    for queue in ("team-a", "team-b"):
        r = httpx.post(
            f"{proc.url}/api/v1/tokens",
            json={"queue": queue, "name": queue},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert r.status_code == 201, r.text
        tokens[queue] = r.json()["token"]
    try:
        yield proc.url, home, tokens
    finally:
        proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def _submit(url: str, token: str, queue: str, args: list[str], script: str = ESCAPE) -> dict:
    body = {"name": f"{queue}-job", "queue": queue, "script": script, "args": args}
    body |= {"workdir": str(SCRIPTS), "max_restarts": 0}
    r = httpx.post(f"{url}/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text
    return r.json()


def _wait(url: str, token: str, job_id: str, states: set[str], timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{url}/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
        job = r.json()
        if job["state"] in states or time.monotonic() > deadline:
            assert job["state"] in states, job
            return job
        time.sleep(0.2)


def _wait_file(path: Path, what: str, timeout_s: float = 60) -> None:
    """Until the job writes `path` (`what` it failed to do otherwise)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _run_dir(home: Path, job_id: str) -> Path:
    """Where the server put the job's run directory (its home, or the fallback)."""
    found = [home / "runs" / job_id, *Path("/var/lib/argosy").glob(f"runs-*/{job_id}")]
    return next(p for p in found if p.exists())


def test_a_hostile_job_reaches_no_token_and_no_other_tenant(
    server: tuple[str, Path, dict[str, str]],
) -> None:
    url, home, tokens = server
    victim = _submit(url, tokens["team-b"], "team-b", ["--hold-s", "120"])
    _wait(url, tokens["admin"], victim["id"], {"running"})
    victim_run = _run_dir(home, victim["id"])
    _wait_file(victim_run / "ready", "the victim never wrote its secret")
    secret = (victim_run / "secret.txt").read_text()

    attacker = _submit(url, tokens["team-a"], "team-a", ["--other-run", str(victim_run)])
    done = _wait(url, tokens["admin"], attacker["id"], {"succeeded", "failed"})
    (victim_run / "release").write_text("")
    report = json.loads((_run_dir(home, attacker["id"]) / "report.json").read_text())

    leaks = {k: v for k, v in report.items() if v["result"] == "LEAK"}
    assert not leaks, leaks
    for must_be_denied in (
        "home/admin.token",
        "home/argosy.db",
        "home listing",
        "other tenant secret",
        "other tenant listing",
        "other tenant plant",
        "/proc environ",
        "signal foreign processes",
        "hard link to the admin token",
        "attempt records",
    ):
        assert report[must_be_denied]["result"] == "denied", (must_be_denied, report)
    env = report["env"]["detail"]
    assert "ARGOSY_HOME" not in env and "TOKEN" not in env.upper()

    secrets_ = [tokens["admin"], tokens["team-a"], tokens["team-b"], secret]
    auth = {"Authorization": f"Bearer {tokens['team-a']}"}
    served = [json.dumps(done)]
    for rank in ("0", "launcher"):
        r = httpx.get(
            f"{url}/api/v1/jobs/{attacker['id']}/logs", params={"rank": rank}, headers=auth
        )
        served.append(r.text)
    events = httpx.get(f"{url}/api/v1/jobs/{attacker['id']}/events", headers=auth)
    served.append(events.text)
    for text in served:
        for s in secrets_:
            assert s not in text, "a secret came back through the API"
    assert oct(home.stat().st_mode & 0o777) == "0o711"
    for name in ("admin.token", "argosy.db"):
        assert (home / name).stat().st_mode & 0o077 == 0, name


def test_each_job_of_a_queue_runs_as_that_queues_user_cold_or_warm(
    server: tuple[str, Path, dict[str, str]],
) -> None:
    """The second job of a queue starts from a warm process kept for its user: it runs
    as that user all the same, and its output reaches the launcher log."""
    import pwd

    url, home, tokens = server
    steps = str(SCRIPTS / "steps.py")
    owners = []
    for _ in range(2):
        body = {"name": "steps", "queue": "team-a", "script": steps, "args": ["--steps", "2"]}
        body["workdir"] = str(SCRIPTS)
        r = httpx.post(
            f"{url}/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {tokens['team-a']}"}
        )
        assert r.status_code == 201, r.text
        job = _wait(url, tokens["admin"], r.json()["id"], {"succeeded", "failed"})
        assert job["state"] == "succeeded", job
        run = _run_dir(home, job["id"])
        owners.append(pwd.getpwuid((run / "starts.txt").stat().st_uid).pw_name)
        launcher = httpx.get(
            f"{url}/api/v1/jobs/{job['id']}/logs",
            params={"rank": "launcher"},
            headers={"Authorization": f"Bearer {tokens['team-a']}"},
        )
        assert launcher.status_code == 200
    assert owners == ["argosy-job-team-a"] * 2


def test_what_a_job_leaves_behind_ends_with_it(
    server: tuple[str, Path, dict[str, str]],
) -> None:
    """A job starts a process that leaves its session and clears its environment (the
    environment scan cannot find it). It runs as the queue's user inside the attempt's
    cgroup, and once the job has succeeded it is gone."""
    import pwd

    from argosy.core.procs import pid_alive
    from argosy.executors.cgroups import JobCgroups

    if JobCgroups.here() is None:
        pytest.skip("no cgroup v2 this server may write: the environment scan alone holds")
    url, home, tokens = server
    job = _submit(url, tokens["team-a"], "team-a", [], script=str(SCRIPTS / "linger.py"))
    _wait(url, tokens["admin"], job["id"], {"running"})
    run = _run_dir(home, job["id"])
    _wait_file(run / "lingering.pid", "the job never left its process behind")
    pid = int((run / "lingering.pid").read_text())
    status = Path(f"/proc/{pid}/status").read_text()
    uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
    assert uid == pwd.getpwnam("argosy-job-team-a").pw_uid
    assert "/argosy-jobs/" in Path(f"/proc/{pid}/cgroup").read_text()
    (run / "release").write_text("")
    done = _wait(url, tokens["admin"], job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    deadline = time.monotonic() + 10
    while pid_alive(pid):
        assert time.monotonic() < deadline, "a process the job left behind outlived it"
        time.sleep(0.1)
