"""The console's handlers through FastAPI's TestClient (no browser, a fake executor): the
login session, every page, and the error paths, each of which must show a message on the
page, never a stack trace. (Sessions, CSRF and the HTTP guards: test_console_guards.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_helpers import login_client
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.config import ServerConfig
from argosy.server.console.web import COOKIE

PAGES = ["/", "/?window_h=24", "/queues", "/jobs", "/services", "/nodes", "/sim", "/submit"]
QUEUES = "queues:\n  - name: org\n    children:\n      - name: a\n      - name: b\n"
NUM_JOBS = 120
ZERO_RANKS = "name: a\nscript: x.py\nnproc_per_node: 0\n"


@pytest.fixture(scope="module")
def app_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    home = tmp_path_factory.mktemp("home")
    queues = home / "queues.yaml"
    queues.write_text(QUEUES)
    config = ServerConfig(home=home, queues_file=queues, cycle_interval_s=0.2)
    nodes = [NodeInfo("n0", "cpu", 4), NodeInfo("n1", "cpu", 4)]
    with TestClient(create_app(config, FakeExecutor(nodes))) as client:
        store = client.app.state.control.store
        for i in range(NUM_JOBS):  # stored directly: pending rows the pages must page through
            spec = {"name": f"job-{i:03d}", "queue": "ab"[i % 2], "script": "x.py"}
            store.insert_job(spec, now=time.time())
        yield client, home


def log_in(client: TestClient, token: str) -> TestClient:
    """Log in through the form; later POSTs send the session's CSRF token as htmx does."""
    client.headers.pop("X-CSRF-Token", None)
    client.headers["X-CSRF-Token"] = login_client(client, token)
    return client


@pytest.fixture
def admin(app_home: tuple[TestClient, Path]) -> TestClient:
    client, home = app_home
    return log_in(client, (home / "admin.token").read_text().strip())


def queue_token(client: TestClient, home: Path, queue: str) -> str:
    admin = {"Authorization": "Bearer " + (home / "admin.token").read_text().strip()}
    return client.post("/api/v1/tokens", json={"queue": queue}, headers=admin).json()["token"]


def message(html: str) -> str:
    found = re.search(r'class="flash error">(.*?)<', html, re.S)
    assert found, html[:500]
    assert "Traceback" not in html
    return found.group(1).strip().replace("&#39;", "'")


@pytest.mark.parametrize("path", PAGES)
def test_pages_need_a_session_and_send_to_login(app_home, path: str) -> None:
    client, _ = app_home
    client.cookies.clear()
    r = client.get(path, follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"].startswith("/login?next=")
    r = client.get(path, headers={"HX-Request": "true"}, follow_redirects=False)
    assert r.status_code == 204 and r.headers["hx-redirect"].startswith("/login")


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_for_admin(admin: TestClient, path: str) -> None:
    r = admin.get(path)
    assert r.status_code == 200, r.text[:300]
    assert "<nav>" in r.text


def test_login_sets_a_strict_httponly_cookie_and_refuses_unknown_tokens(app_home) -> None:
    client, home = app_home
    client.cookies.clear()
    r = client.post("/login", data={"token": "argosy_nope"}, follow_redirects=False)
    assert r.status_code == 401 and "unknown token" in r.text
    assert "set-cookie" not in r.headers
    token = (home / "admin.token").read_text().strip()
    form = {"token": token, "next": "//evil.example/x"}
    r = client.post("/login", data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    log_in(client, token)
    r = client.post("/logout", follow_redirects=False)
    assert r.status_code == 303
    assert COOKIE not in client.cookies or not client.cookies.get(COOKIE)


@pytest.mark.parametrize(
    ("path", "want_status", "want_message"),
    [
        ("/jobs/jdoesnotexist", 404, "no job 'jdoesnotexist'"),
        ("/jobs?state=runing", 422, "unknown state 'runing'; known: pending"),
        ("/jobs?limit=1", 422, "field 'limit'"),
        ("/?window_h=5", 422, "known: 1, 6, 24, 168"),
        ("/sim/nothing.json", 404, "no report 'nothing.json'"),
        ("/sim/admin.token", 404, "use letters, digits"),
    ],
    ids=["unknown-job", "unknown-state", "limit-range", "window", "no-report", "not-a-report-name"],
)
def test_bad_requests_show_a_message(admin, path, want_status, want_message) -> None:
    r = admin.get(path)
    assert r.status_code == want_status
    assert want_message in message(r.text)


@pytest.mark.parametrize(
    ("form", "want_status", "want_message"),
    [
        ({"yaml": ZERO_RANKS}, 422, "job YAML:3 field 'nproc_per_node'"),
        ({"yaml": "name: a\n  script: [x\n"}, 422, "malformed YAML"),
        ({"yaml": "name: a\nscript: x.py\ncolour: red\n"}, 422, "field 'colour'"),
        ({"yaml": "name: a\nqueue: c\nscript: /bin/true\n"}, 422, "known: a, b"),
        ({"name": "bad name!", "script": "x.py"}, 422, "field 'name'"),
        ({"name": "a", "script": "x.py", "workdir": "relative"}, 422, "workdir"),
        ({"name": "a", "script": "x.py", "nproc_per_node": "many"}, 422, "nproc_per_node"),
        ({"name": "a", "script": "x.py"}, 422, "field 'script': script '/tmp/x.py' does not"),
    ],
    ids=[
        "yaml-range",
        "yaml-malformed",
        "yaml-unknown-key",
        "unknown-queue",
        "bad-name",
        "relative-workdir",
        "not-a-number",
        "missing-script",
    ],
)
def test_bad_submissions_name_the_field(admin, form, want_status, want_message) -> None:
    r = admin.post("/submit", data={"workdir": "/tmp", **form}, follow_redirects=False)
    assert r.status_code == want_status
    assert want_message in message(r.text)


def test_htmx_errors_are_swapped_into_the_flash_area(admin: TestClient) -> None:
    r = admin.post("/nodes/nx/cordon", headers={"HX-Request": "true"})
    assert r.status_code == 200  # htmx swaps only 2xx answers
    assert r.headers["hx-retarget"] == "#flash"
    assert "unknown node 'nx'; known: n0, n1" in message(r.text)


def test_a_queue_token_acts_only_in_its_queue(app_home) -> None:
    client, home = app_home
    log_in(client, queue_token(client, home, "a"))
    form = {"name": "x", "queue": "b", "script": "/bin/true", "workdir": "/tmp"}
    r = client.post("/submit", data=form)
    assert r.status_code == 403 and "only to queue 'a'" in message(r.text)
    in_b = client.app.state.control.store.list_jobs(queue="b", limit=1)[0][0]
    r = client.post(f"/jobs/{in_b['id']}/cancel")
    assert r.status_code == 403 and "only in queue 'a'" in message(r.text)
    r = client.post("/nodes/n0/cordon")
    assert r.status_code == 403 and "admin" in message(r.text)
    r = client.post("/submit", data=form | {"queue": "a"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/jobs/j")


def test_cancel_and_cordon_change_the_cluster(admin: TestClient) -> None:
    ctl = admin.app.state.control
    job = ctl.store.list_jobs(states=["pending"], limit=1)[0][0]
    r = admin.post(f"/jobs/{job['id']}/cancel", follow_redirects=False)
    assert r.status_code == 303
    assert ctl.job(job["id"])["state"] == "cancelled"
    assert admin.post("/nodes/n1/cordon", follow_redirects=False).status_code == 303
    assert "n1" in ctl.cordoned
    admin.post("/nodes/n1/uncordon", follow_redirects=False)
    assert "n1" not in ctl.cordoned


def _page_through(client: TestClient, query: str) -> list[str]:
    ids, url = [], f"/jobs?{query}"
    for _ in range(NUM_JOBS + 2):
        html = client.get(url, headers={"HX-Request": "true"}).text
        ids += re.findall(r'<td class="mono">(j[0-9a-f]{12})</td>', html)
        older = re.search(r'id="older" href="([^"]+)"', html)
        if older is None:
            return ids
        url = older.group(1).replace("&amp;", "&")
    raise AssertionError("paging never ended")


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=st.integers(5, 80), queue=st.sampled_from(["", "a", "b"]))
def test_paging_visits_each_matching_job_once_newest_first(admin, limit, queue) -> None:
    ids = _page_through(admin, f"queue={queue}&limit={limit}")
    rows, _ = admin.app.state.control.store.list_jobs(queue=queue or None, limit=500)
    want_ids = [r["id"] for r in reversed(rows)]
    assert ids == want_ids


def test_the_job_page_shows_server_events_and_its_log_endpoint_pages(admin, app_home) -> None:
    _, home = app_home
    ctl = admin.app.state.control
    job = ctl.store.list_jobs(limit=1)[0][0]
    log = ctl.run_dir(job["id"]) / "logs" / "attempt2" / "rank0.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 1\nstep 2\n")
    html = admin.get(f"/jobs/{job['id']}").text
    assert "submitted" in html and job["name"] in html
    first = admin.get(f"/jobs/{job['id']}/log", params={"offset": 0}).json()
    name = first["file"]  # the log's place and its inode
    assert first == {"text": "step 1\nstep 2\n", "next": 14, "file": name}
    assert name.startswith("logs/attempt2/rank0.log@")  # its place and its inode
    with log.open("a") as f:
        f.write("step 3\n")
    more = admin.get(f"/jobs/{job['id']}/log", params={"offset": 14, "file": name}).json()
    assert more["text"] == "step 3\n"
    newer = log.parent.parent / "attempt10" / "rank0.log"  # attempt 10 sorts after 2
    newer.parent.mkdir()
    newer.write_text("resumed\n")
    moved = admin.get(f"/jobs/{job['id']}/log", params={"offset": 21, "file": name}).json()
    assert moved["text"] == "resumed\n" and moved["next"] == 8
    assert moved["file"].startswith("logs/attempt10/rank0.log@")


def test_an_unexpected_error_is_a_plain_message_not_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "sim-reports").write_text("a file where the report folder should be")
    config = ServerConfig(home=home)
    with TestClient(create_app(config, FakeExecutor([NodeInfo("n0", "cpu", 1)]))) as client:
        log_in(client, (home / "admin.token").read_text().strip())
        files = {"report": ("r.json", b'{"policy": "x", "five_factor": {}}', "application/json")}
        r = client.post("/sim", files=files)
    assert r.status_code == 500
    assert message(r.text).startswith("internal error (FileExistsError)")


def test_a_gang_s_job_page_has_a_row_per_node_rank(admin) -> None:
    ctl = admin.app.state.control
    job = ctl.store.list_jobs(limit=1, cursor=3)[0][0]
    rows = [
        {"node_rank": 0, "node": "n0", "status": "completed", "final_step": 40,
         "effective_training_time": 0.9, "lost_s": 1.5, "restarts": 0, "faults": 0},
        {"node_rank": 1, "node": "n1", "status": "missing", "final_step": None,
         "effective_training_time": None, "lost_s": None, "restarts": None, "faults": None},
    ]  # fmt: skip
    ctl.store.update_job(job["id"], {"summary": {"status": "completed", "nodes": rows}})
    html = admin.get(f"/jobs/{job['id']}").text
    table = html[html.index('id="node-ranks"') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 3  # the header and one row per node rank
    assert '<a href="/nodes">n1</a>' in table and "missing" in table and "90.0%" in table
