"""Console sessions, CSRF and the HTTP guards through FastAPI's TestClient (the app's own
middleware stack, a fake executor): a POST without its session's CSRF token, or from
another origin, changes nothing; logout, expiry and revocation end a session; the cookie
is never an API token; bodies and fields are capped without a 500 or an echo; every
kind of response carries the security headers; simulator reports keep their owner.
(The same guards against a real server process: tests/server/test_server_guards.py;
in a real browser, from pages on other origins: test_console_browser.py.)"""

from __future__ import annotations

import html
import logging
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
from argosy.server.guards import SECURITY_HEADERS
from argosy.server.sessions import session_hash
from argosy.server.tables import sessions

QUEUES = "queues:\n  - name: org\n    children:\n      - name: a\n      - name: b\n"
REPORT = b'{"runs": [{"policy": "fifo", "five_factor": {}}]}'
OWN_ORIGINS = ["http://testserver", "http://testserver:80", "http://TestServer"]
OTHER_ORIGINS = [
    "http://testserver:8080",
    "https://testserver",
    "http://127.0.0.1",
    "http://evil.example",
    "null",
    "http://testserver.evil.example",
    "http://testserver/",
]
SITES = ["same-origin", "same-site", "cross-site", "none"]


@pytest.fixture(scope="module")
def app_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    home = tmp_path_factory.mktemp("home")
    (home / "queues.yaml").write_text(QUEUES)
    (home / "work").mkdir()
    (home / "work" / "job.py").write_text("print('hi')\n")
    config = ServerConfig(home=home, queues_file=home / "queues.yaml", cycle_interval_s=0.2)
    nodes = [NodeInfo("n0", "cpu", 4), NodeInfo("n1", "cpu", 4)]
    with TestClient(create_app(config, FakeExecutor(nodes))) as client:
        yield client, home


def admin_token(home: Path) -> str:
    return (home / "admin.token").read_text().strip()


def browser(app_home: tuple[TestClient, Path], token: str) -> tuple[TestClient, str]:
    """A client of its own (its own cookie jar) logged in with `token`, and its CSRF."""
    client = TestClient(app_home[0].app)  # the running app; no second lifespan
    return client, login_client(client, token)


def admin_api(home: Path) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token(home)}"}


def new_token(app_home: tuple[TestClient, Path], queue: str) -> dict:
    body = {"queue": queue, "name": f"team-{queue}"}
    return app_home[0].post("/api/v1/tokens", json=body, headers=admin_api(app_home[1])).json()


def queue_token(app_home: tuple[TestClient, Path], queue: str) -> str:
    return new_token(app_home, queue)["token"]


def submit_form(home: Path, name: str) -> dict[str, str]:
    return {"name": name, "queue": "a", "script": "job.py", "workdir": str(home / "work")}


def job_names(client: TestClient) -> set[str]:
    rows, _ = client.app.state.control.store.list_jobs(limit=500)
    return {r["name"] for r in rows}


def no_redirect(client: TestClient, method: str, path: str, **kw: object):  # noqa: ANN201
    return client.request(method, path, follow_redirects=False, **kw)


# ---- CSRF --------------------------------------------------------------------------------
@pytest.mark.parametrize("sent", ["missing", "wrong", "another-session"])
def test_a_post_without_its_sessions_csrf_token_is_refused_and_changes_nothing(
    app_home, sent: str
) -> None:
    client, home = app_home
    admin, _ = browser(app_home, admin_token(home))
    _, other_csrf = browser(app_home, admin_token(home))
    ctl = client.app.state.control
    victim = {"name": "victim", "queue": "b", "script": "x.py"}  # stored directly: pending
    job_id = ctl.store.insert_job(victim, now=time.time())[0]["id"]
    token = {"missing": None, "wrong": "x" * 43, "another-session": other_csrf}[sent]
    field = {} if token is None else {"csrf": token}
    names_before, state_before = job_names(client), ctl.job(job_id)["state"]
    files = {"report": ("csrf.json", REPORT, "application/json")}
    attempts = [
        ("/submit", {"data": submit_form(home, "csrf-probe") | field}),
        (f"/jobs/{job_id}/cancel", {"data": field}),
        ("/nodes/n0/cordon", {"data": field}),
        ("/sim", {"data": field, "files": files}),
        ("/logout", {"data": field}),
    ]
    for path, kw in attempts:
        r = no_redirect(admin, "POST", path, **kw)
        assert r.status_code == 403, (path, r.status_code, r.text[:300])
        assert "CSRF token is missing or out of date" in r.text
        htmx = {"HX-Request": "true"} | ({"X-CSRF-Token": token} if token else {})
        r = no_redirect(admin, "POST", path, headers=htmx, **kw)
        assert r.status_code == 403 and r.headers["hx-retarget"] == "#flash", path
    assert job_names(client) == names_before
    assert ctl.job(job_id)["state"] == state_before
    assert "n0" not in ctl.cordoned
    assert not (home / "sim-reports" / "csrf.json").exists()
    assert no_redirect(admin, "GET", "/jobs").status_code == 200  # logout was refused too


def test_the_csrf_token_works_as_a_form_field_and_as_the_htmx_header(app_home) -> None:
    client, home = app_home
    admin, csrf = browser(app_home, admin_token(home))
    form = submit_form(home, "by-field") | {"csrf": csrf}
    r = no_redirect(admin, "POST", "/submit", data=form)
    assert r.status_code == 303 and r.headers["location"].startswith("/jobs/j")
    headers = {"HX-Request": "true", "X-CSRF-Token": csrf}
    r = no_redirect(admin, "POST", "/nodes/n1/cordon", headers=headers)
    assert r.status_code == 200 and "n1" in client.app.state.control.cordoned
    r = no_redirect(admin, "POST", "/nodes/n1/uncordon", headers=headers)
    assert "n1" not in client.app.state.control.cordoned
    assert "by-field" in job_names(client)
    access = (home / "logs" / "access.log").read_text()
    assert re.search(r'POST /nodes/n1/cordon 200 [0-9.]+ms "admin"', access)
    events, _ = client.app.state.control.store.list_events(limit=10_000)
    assert ("cordoned", "admin") in {(e["kind"], e["actor"]) for e in events}


def test_every_page_carries_the_token_its_forms_and_htmx_send(app_home) -> None:
    _, home = app_home
    admin, csrf = browser(app_home, admin_token(home))
    for path in ("/", "/jobs", "/nodes", "/sim", "/submit"):
        html = admin.get(path).text
        assert f'hx-headers=\'{{"X-CSRF-Token": "{csrf}"}}\'' in html, path
        assert html.count('name="csrf"') == html.count('method="post"'), path


# ---- same origin -------------------------------------------------------------------------
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    origin=st.one_of(st.none(), st.sampled_from(OWN_ORIGINS + OTHER_ORIGINS), st.text(max_size=30)),
    site=st.one_of(st.none(), st.sampled_from(SITES)),
)
def test_a_console_post_passes_only_from_this_origin(app_home, origin, site) -> None:
    client, home = app_home
    ctl = client.app.state.control
    admin, csrf = admin_session(app_home)
    headers = {"X-CSRF-Token": csrf}
    headers |= {} if origin is None else {"Origin": origin}
    headers |= {} if site is None else {"Sec-Fetch-Site": site}
    want_allowed = origin in (None, *OWN_ORIGINS) and site in (None, "same-origin")
    try:
        r = no_redirect(admin, "POST", "/nodes/n0/cordon", headers=headers)
    except UnicodeEncodeError:
        return  # not a header value any client can send
    if want_allowed:
        assert r.status_code == 303 and "n0" in ctl.cordoned, r.text[:300]
        ctl.set_cordon("n0", False)
    else:
        assert r.status_code == 403 and "cross-site request refused" in r.text
        assert "n0" not in ctl.cordoned


_ADMIN_SESSIONS: dict[int, tuple[TestClient, str]] = {}


def admin_session(app_home: tuple[TestClient, Path]) -> tuple[TestClient, str]:
    """One admin session for the property test's many examples."""
    key = id(app_home[0])
    if key not in _ADMIN_SESSIONS:
        _ADMIN_SESSIONS[key] = browser(app_home, admin_token(app_home[1]))
    return _ADMIN_SESSIONS[key]


def test_login_from_another_origin_is_refused(app_home) -> None:
    client, home = app_home
    fresh = TestClient(client.app)
    headers = {"Origin": "http://testserver:9999", "Sec-Fetch-Site": "same-site"}
    r = no_redirect(fresh, "POST", "/login", data={"token": admin_token(home)}, headers=headers)
    assert r.status_code == 403 and "set-cookie" not in r.headers


def test_the_rest_api_checks_the_origin_only_of_cookie_requests(app_home) -> None:
    client, home = app_home
    before = job_names(client)
    evil = {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"}
    body = {"name": "api-cookie", "queue": "a", "script": "job.py", "workdir": str(home / "work")}
    cookie = {"Cookie": f"{COOKIE}=anything"}
    r = no_redirect(client, "POST", "/api/v1/jobs", json=body, headers=evil | cookie)
    assert r.status_code == 403 and r.json()["detail"].startswith("cross-site request refused")
    r = no_redirect(client, "POST", "/api/v1/jobs", json=body, headers=cookie)
    assert r.status_code == 401  # the API takes no cookie as a credential
    r = no_redirect(client, "POST", "/api/v1/jobs", json=body, headers=evil | admin_api(home))
    assert r.status_code == 201, r.text  # a bearer token is no ambient credential
    assert job_names(client) - before == {"api-cookie"}


# ---- the session's life ------------------------------------------------------------------
def test_logout_makes_the_old_cookie_useless(app_home) -> None:
    client, home = app_home
    admin, csrf = browser(app_home, admin_token(home))
    old = admin.cookies[COOKIE]
    assert no_redirect(admin, "POST", "/logout", data={"csrf": csrf}).status_code == 303
    replay = TestClient(client.app, cookies={COOKIE: old})
    assert no_redirect(replay, "GET", "/jobs").headers["location"].startswith("/login")
    r = no_redirect(replay, "POST", "/nodes/n0/cordon", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    assert "n0" not in client.app.state.control.cordoned


def test_an_expired_session_is_refused_and_deleted(app_home) -> None:
    client, home = app_home
    admin, _ = browser(app_home, admin_token(home))
    digest = session_hash(admin.cookies[COOKIE])
    store_sessions = client.app.state.sessions
    assert store_sessions.ttl_s == 12 * 3600  # ServerConfig.session_ttl_s's default
    assert no_redirect(admin, "GET", "/").status_code == 200
    store_sessions.clock = lambda: time.time() + store_sessions.ttl_s + 1  # its clock moves on
    try:
        assert no_redirect(admin, "GET", "/").headers["location"].startswith("/login")
    finally:
        store_sessions.clock = time.time
    assert no_redirect(admin, "GET", "/").headers["location"].startswith("/login")  # gone
    with client.app.state.control.store.engine.connect() as c:
        assert c.execute(sessions.select().where(sessions.c.hash == digest)).first() is None


def test_a_revoked_token_ends_its_sessions(app_home) -> None:
    client, home = app_home
    created = new_token(app_home, "b")
    user, _ = browser(app_home, created["token"])
    assert no_redirect(user, "GET", "/jobs").status_code == 200
    r = client.delete(f"/api/v1/tokens/{created['id']}", headers=admin_api(home))
    assert r.status_code == 200, r.text
    assert no_redirect(user, "GET", "/jobs").headers["location"].startswith("/login")


def test_the_cookie_is_never_an_api_token(app_home) -> None:
    client, home = app_home
    token = admin_token(home)
    admin, _ = browser(app_home, token)
    cookie = admin.cookies[COOKIE]
    assert cookie != token and token not in cookie and len(cookie) >= 40
    r = TestClient(client.app).get("/api/v1/jobs", headers={"Authorization": f"Bearer {cookie}"})
    assert r.status_code == 401
    as_cookie = TestClient(client.app, cookies={COOKIE: token})
    assert no_redirect(as_cookie, "GET", "/jobs").headers["location"].startswith("/login")
    with client.app.state.control.store.engine.connect() as c:
        stored = {r.hash for r in c.execute(sessions.select())}
    assert session_hash(cookie) in stored and cookie not in stored


# ---- limits ------------------------------------------------------------------------------
def test_oversized_and_malformed_console_input_is_a_4xx_page(app_home, caplog) -> None:
    client, home = app_home
    admin, csrf = browser(app_home, admin_token(home))
    fresh = TestClient(client.app)
    caplog.set_level(logging.INFO)
    huge, big = "t" * (10 << 20), "y" * 300_000
    cases = [
        (fresh, "/login", {"data": {"token": huge}}, 413, "over the limit of 1048576 bytes"),
        (admin, "/submit", {"data": {"yaml": huge, "csrf": csrf}}, 413, "max_body_bytes"),
        (fresh, "/login", {"data": {"token": big}}, 422, "field 'token'"),
        (admin, "/submit", {"data": {"yaml": big, "csrf": csrf}}, 422, "field 'yaml'"),
    ]
    for who, path, kw, want_status, want in cases:
        r = no_redirect(who, "POST", path, **kw)
        assert r.status_code == want_status, (path, r.status_code, r.text[:200])
        assert want in html.unescape(r.text) and len(r.text) < 5000
    broken = {"Content-Type": "multipart/form-data; boundary=xx", "X-CSRF-Token": csrf}
    for body in (b"--xx\r\nContent-Disposition: form-data\r\n\r\nno end", b"\xff" * 100):
        r = no_redirect(admin, "POST", "/submit", content=body, headers=broken)
        assert 400 <= r.status_code < 500, r.text[:300]
    assert not [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.ERROR]


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 600))
def test_a_422_repeats_only_short_input(app_home, size: int) -> None:
    client, home = app_home
    bearer = admin_api(home)
    body = {"name": "!" * size, "script": "x.py"}
    r = client.post("/api/v1/jobs", json=body, headers=bearer)
    assert r.status_code == 422
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "name"]]
    assert error["msg"].startswith("String should")
    assert ("input" in error) == (size <= 198)  # repr() adds the quotes
    assert len(r.content) < 1000


def test_a_422_of_a_large_body_is_small(app_home) -> None:
    client, home = app_home
    bearer = admin_api(home)
    body = {"name": "n", "script": "x.py", "args": "a" * 900_000, "nnodes": "z" * 1000}
    r = client.post("/api/v1/jobs", json=body, headers=bearer)
    assert r.status_code == 422 and len(r.content) < 2000, r.text[:500]
    assert {tuple(e["loc"]) for e in r.json()["detail"]} >= {("body", "args"), ("body", "nnodes")}


# ---- security headers ----------------------------------------------------------------------
def test_every_kind_of_response_carries_the_security_headers(app_home) -> None:
    client, home = app_home
    admin, csrf = browser(app_home, admin_token(home))
    anon = TestClient(client.app)
    bearer = admin_api(home)
    evil = {"Origin": "http://evil.example"}
    requests = [
        (anon, "GET", "/api/v1/health", {}),
        (anon, "GET", "/api/v1/jobs", {}),  # 401
        (anon, "GET", "/api/v1/jobs", {"headers": bearer}),
        (anon, "POST", "/api/v1/jobs", {"headers": bearer, "json": {"name": 1}}),  # 422
        (anon, "POST", "/api/v1/jobs", {"headers": bearer, "content": b"x" * (2 << 20)}),  # 413
        (anon, "GET", "/metrics", {"headers": bearer}),
        (anon, "GET", "/openapi.json", {}),
        (anon, "GET", "/docs", {}),
        (anon, "GET", "/nowhere", {}),  # 404
        (anon, "GET", "/jobs", {}),  # 303 to login
        (anon, "GET", "/login", {}),
        (anon, "GET", "/static/console.js", {}),
        (admin, "GET", "/", {}),
        (admin, "GET", "/jobs/jnope", {}),  # 404 page
        (admin, "POST", "/nodes/n0/cordon", {"headers": evil | {"X-CSRF-Token": csrf}}),  # 403
        (admin, "POST", "/nodes/n0/cordon", {}),  # 403 CSRF
    ]
    for who, method, path, kw in requests:
        r = no_redirect(who, method, path, **kw)
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, (method, path, r.status_code, name)
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        want_cache = None if path.startswith("/static/") else "no-store"
        assert r.headers.get("cache-control") == want_cache, (path, r.status_code)
    page = admin.get("/").headers["content-security-policy"]
    assert "script-src 'self';" in page and "unsafe" not in page


# ---- simulator reports ---------------------------------------------------------------------
def upload(who: tuple[TestClient, str], name: str, policy: str) -> int:
    client, csrf = who
    body = REPORT.replace(b"fifo", policy.encode())
    files = {"report": (name, body, "application/json")}
    return no_redirect(client, "POST", "/sim", data={"csrf": csrf}, files=files).status_code


def stored_policy(home: Path, name: str) -> str:
    return (home / "sim-reports" / name).read_text().split('"policy": "')[1].split('"')[0]


def test_a_queue_overwrites_only_its_own_queues_reports(app_home) -> None:
    _, home = app_home
    admin = browser(app_home, admin_token(home))
    a1, a2 = (browser(app_home, queue_token(app_home, "a")) for _ in range(2))
    b = browser(app_home, queue_token(app_home, "b"))
    assert upload(admin, "adm.json", "admin-1") == 303
    assert upload(a1, "adm.json", "a-1") == 403  # an admin's report
    assert upload(a1, "team-a.json", "a-1") == 303  # a new name: anyone logged in
    assert upload(a2, "team-a.json", "a-2") == 303  # another token of the same queue
    assert upload(b, "team-a.json", "b-1") == 403
    assert stored_policy(home, "adm.json") == "admin-1"
    assert stored_policy(home, "team-a.json") == "a-2"
    r = b[0].post("/sim", data={"csrf": b[1]}, files={"report": ("team-a.json", REPORT)})
    assert "uploaded by queue 'a'" in html.unescape(r.text)
    assert upload(admin, "team-a.json", "admin-2") == 303  # an admin overwrites any
    assert upload(a1, "team-a.json", "a-3") == 403  # and it is the admin's now
    (home / "sim-reports" / "by-hand.json").write_bytes(REPORT)  # copied in: an admin's
    assert upload(a1, "by-hand.json", "a-4") == 403
    assert b[0].get("/sim/team-a.json").status_code == 200  # everyone may read
    assert "team-a.json" in b[0].get("/sim").text
    assert not any(p.name.startswith(".") for p in (home / "sim-reports").glob("*.json"))
