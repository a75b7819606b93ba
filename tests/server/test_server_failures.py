"""Failures say why: the launcher's own error line in a failed job's reason and events
(of a rank's output, only an exception's class; the whole line for the job's queue),
its output served by the logs API (`rank=launcher`), a service whose replica fails the
same way twice in a row stopped with that line, and `finished_at` taken from the
attempt's own exit record when the job ended while the server was down. Real launches
through the local executor; the restart test runs a real server process."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from server_helpers import SCRIPTS, STEPS, TERMINAL, WORKDIR, ServerProcess, fast_config, wait_for

from argosy.cli import launch
from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.executors.local import attempt_dir
from argosy.server.app import create_app
from argosy.server.failures import ERROR_LINE_CHARS, public_line, telling, telling_line
from argosy.server.views import launcher_error

pytestmark = pytest.mark.integration

PROGRESS = str(SCRIPTS / "progress.py")
TRACEBACK = """[argosy] fault: rank 0 exited with code 1 (attempt 0); no restarts left
failed: step 2, loss 0.5, effective training time 10.0%, 0 restart(s)
cause: rank 0 exited with code 1
rank 0, last lines:
  Traceback (most recent call last):
    File "/w/train.py", line 9, in <module>
      open("/data/shard-7")
  FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-7'
"""
USAGE_BOX = """Usage: python -m argosy launch [OPTIONS] {script} [script_args]...
╭─ Error ──────────────────────────────────────────╮
│ No such option: --bogus                          │
╰──────────────────────────────────────────────────╯
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (TRACEBACK, "FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-7'"),
        ("starting\nerror: script 'x.py' not found\n", "error: script 'x.py' not found"),
        ("argosy serve: error: unknown model 'm'\n", "argosy serve: error: unknown model 'm'"),
        (USAGE_BOX, "No such option: --bogus"),
        ("sh: 1: exec: /usr/bin/python: Argument list too long\n", "Argument list too long"),
        ("rank 1, last lines:\n  diverged: loss is nan\n", "diverged: loss is nan"),
        ("[argosy] all good\ncompleted: step 3\n", ""),
        ("", ""),
    ],
    ids=[
        "traceback",
        "error-line",
        "serve-error",
        "usage-box",
        "os-error",
        "rank-line",
        "none",
        "empty",
    ],
)
def test_the_telling_line_of_a_launchers_output(text: str, want: str) -> None:
    got = telling_line(text)
    assert (want in got) if want else got == ""


def test_the_error_line_is_read_from_the_tail_and_capped(tmp_path: Path) -> None:
    where = attempt_dir(tmp_path, 1)
    where.mkdir(parents=True)
    noise = "".join(f"step {i}\n" for i in range(20_000))  # far more than the tail
    (where / "output.log").write_text(noise + "ValueError: " + "x" * 1000 + "\n")
    line = launcher_error(tmp_path, 1)
    assert line.startswith("ValueError: xxx") and len(line) == ERROR_LINE_CHARS
    assert launcher_error(tmp_path, 2) == ""  # no such attempt: no line


def test_a_failed_job_says_why_and_serves_its_launcher_output(client: TestClient) -> None:
    body = {
        "name": "boom",
        "script": PROGRESS,
        "workdir": WORKDIR,
        "args": ["--steps", "5", "--step-s", "0.01", "--raise-at", "3"],
        "max_restarts": 0,
    }
    job = client.post("/api/v1/jobs", json=body).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=60)
    want = "RuntimeError: the loss exploded at step 3"  # a rank's output: the job's own words
    public = "RuntimeError (its message is in the job's output)"
    assert done["state"] == "failed" and public in done["reason"], done["reason"]
    assert want not in done["reason"]
    shown = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert shown["error"] == want  # whole, for the job's queue and the admins
    events = client.get(f"/api/v1/jobs/{job['id']}/events").json()["items"]
    assert any(e["kind"] == "failed" and public in e["message"] for e in events), events
    assert not any(want in e["message"] for e in events)
    logs = client.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": "launcher"})
    assert logs.status_code == 200 and want in logs.text
    assert int(logs.headers["x-next-offset"]) == len(logs.content)
    rest = client.get(
        f"/api/v1/jobs/{job['id']}/logs", params={"rank": "launcher", "offset": len(logs.content)}
    )
    assert rest.text == ""
    assert "step 2" in client.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 0}).text
    assert client.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": "nope"}).status_code == 422


def test_a_service_that_fails_the_same_way_twice_stops_with_the_error(client: TestClient) -> None:
    body = {"name": "bad-model", "model": "/no/such-model", "max_restarts": 10}
    service = client.post("/api/v1/services", json=body).json()
    deadline = time.monotonic() + 90
    while (row := client.get(f"/api/v1/services/{service['id']}").json())["state"] != "failed":
        assert time.monotonic() < deadline, row
        time.sleep(0.1)
    assert "unknown model '/no/such-model'" in row["reason"], row["reason"]
    assert "the same way twice" in row["reason"]
    events = client.get(f"/api/v1/services/{service['id']}/events").json()["items"]
    starts = [e for e in events if e["kind"] == "replica_started"]
    assert len(starts) == 2, [e["message"] for e in events]  # restarted once, not ten times


def test_a_job_that_ended_while_the_server_was_down_finishes_when_it_exited(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "home")
    server.start()
    with server.client() as api:
        body = {
            "name": "outlives",
            "script": PROGRESS,
            "workdir": WORKDIR,
            "args": ["--steps", "30", "--step-s", "0.1"],
        }
        job = api.post("/api/v1/jobs", json=body).json()
        wait_for(api, job["id"], {"running"}, timeout_s=60)
    server.kill()
    exit_code = attempt_dir(server.home / "runs" / job["id"], 1) / "exit.code"
    deadline = time.monotonic() + 60
    while not exit_code.exists():
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(0.1)
    exited_s = exit_code.stat().st_mtime
    time.sleep(2.0)  # the server comes back well after the job ended
    server.start()
    try:
        with server.client() as api:
            done = wait_for(api, job["id"], TERMINAL, timeout_s=30)
    finally:
        server.kill()
    assert done["state"] == "succeeded", done
    finished_s = datetime.fromisoformat(done["finished_at"].replace("Z", "+00:00")).timestamp()
    assert abs(finished_s - exited_s) < 0.01, (finished_s, exited_s)


def test_another_queue_reads_a_failure_without_the_ranks_words(tmp_path: Path) -> None:
    """The reason and events every token reads keep of a rank's output an exception's
    class alone; the job's own queue (and the admins) get the whole line as `error`."""
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: org\n    children:\n      - name: a\n      - name: b\n")
    fake, home = FakeExecutor([NodeInfo("n0", "cpu", 2)]), tmp_path / "home"
    with TestClient(create_app(fast_config(home, queues_file=queues), executor=fake)) as api:
        api.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        body = {"name": "j", "script": STEPS, "workdir": WORKDIR, "queue": "a"}
        job_id = api.post("/api/v1/jobs", json=body | {"max_restarts": 0}).json()["id"]
        deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
        while job_id not in fake.running:
            assert time.monotonic() < deadline, "the job was not placed"
            time.sleep(0.02)
        where = attempt_dir(fake.running[job_id].run_dir, 1)
        (where / "output.log").write_text(TRACEBACK.replace("/data/shard-7", "pw=hunter2"))
        fake.finish(job_id, 1)
        wait_for(api, job_id, TERMINAL, timeout_s=60)
        tokens = {q: api.post("/api/v1/tokens", json={"queue": q}).json()["token"] for q in "ab"}
        seen = {
            q: api.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {t}"}).json()
            for q, t in tokens.items()
        }
        assert "hunter2" in seen["a"]["error"] and "hunter2" not in seen["a"]["reason"]
        assert seen["b"]["error"] is None and "hunter2" not in json.dumps(seen["b"])
        assert "FileNotFoundError (its message is in the job's output)" in seen["b"]["reason"]
        events = api.get(f"/api/v1/jobs/{job_id}/events").text + api.get("/api/v1/jobs").text
        assert "hunter2" not in events


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (TRACEBACK, "FileNotFoundError (its message is in the job's output)"),
        ("starting\nerror: script 'x.py' not found\n", "error: script 'x.py' not found"),
        ("rank 1, last lines:\n  diverged: loss is nan\n", "see the job's output"),
        ("rank 1, last lines:\n  x\nerror: the launcher's own\n", "error: the launcher's own"),
    ],
    ids=["rank-exception", "launcher-error", "rank-line", "after-the-quote"],
)
def test_what_every_token_reads_of_the_telling_line(text: str, want: str) -> None:
    got = public_line(*telling(text))
    assert want in got
    if "rank" in text.split("\n")[-2] or "Traceback" in text:
        assert telling_line(text) not in got  # the rank's words are not shown


def test_a_long_rank_line_is_quoted_whole_on_a_narrow_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher never wraps a rank's lines: on an 80-column (or narrower) console a
    long traceback line would wrap, and its tail, unindented, would pass for the
    launcher's own words and put the rank's message into every token's reason."""
    printed = Console(record=True, width=30, force_terminal=False)
    monkeypatch.setattr(launch, "err_console", printed)
    lines = [
        'File "/a/long/path/to/the/training/script/train.py", line 9, in <module>',
        "RuntimeError: the loss exploded at step 3 pw=hunter2",
    ]
    launch._quote_rank_lines(0, lines)
    text = printed.export_text()
    assert text.count("\n") == 3, text
    got = public_line(*telling(text))
    assert got == "RuntimeError (its message is in the job's output)", got
