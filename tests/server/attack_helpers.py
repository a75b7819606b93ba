"""Helpers of the attack corpus (test_attack_corpus.py): one real server with two tenant
queues, the clients that attack it, and a snapshot of everything it stores.

    world = build_world(tmp_path)              # server, tokens, sessions, fixtures
    before = snapshot(world)
    answer = api("team-a", "POST", "/api/v1/jobs/{job_b}/cancel")(world)
    assert snapshot(world) == before           # nothing stored or changed

A sender is a function `World -> Answer`, so the corpus is a table of data: who sends
what, by which route (the REST API with a bearer token, the console with a session's
cookie and CSRF token, or a raw HTTP/1.1 request whose path no client library tidies).
Paths and header values may name the world's ids as `{job_b}`, `{node}`, `{port}`, ...
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from server_helpers import STEPS, WORKDIR, ServerProcess, wait_for

QUEUES = "queues:\n  - name: org\n    children:\n      - name: team-a\n      - name: team-b\n"
REPORT = b'{"runs": [{"policy": "fifo", "five_factor": {}}]}'
COOKIE = "argosy_session"


@dataclass(frozen=True)
class Answer:
    """What came back: status, headers (lower-case names) and body text."""

    status: int
    headers: dict[str, str]
    text: str

    @classmethod
    def of(cls, r: httpx.Response) -> Answer:
        return cls(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.text)


@dataclass
class World:
    """The server under attack and everything the corpus refers to."""

    server: ServerProcess
    tokens: dict[str, str] = field(default_factory=dict)
    """Bearer tokens: admin, team-a, team-b, revoked, expired."""
    ids: dict[str, str] = field(default_factory=dict)
    """job_a, job_b (pending), log_job (finished, team-b), service_b, token_b (a spare
    team-b token's id), admin_token (the server's own), node, port, dead_session."""
    browsers: dict[str, tuple[httpx.Client, str]] = field(default_factory=dict)
    """Logged-in console clients (own cookie jars) and their CSRF tokens."""
    admin: httpx.Client | None = None
    """The admin's API client (kept alive) that takes the snapshots."""

    @property
    def url(self) -> str:
        return self.server.url

    def fill(self, text: str) -> str:
        return text.format(**self.ids) if "{" in text else text

    def log_text(self) -> str:
        path = self.server.home.parent / f"server-{self.server.port}.log"
        return path.read_text(errors="replace")


Send = Callable[[World], Answer]


# ---- senders -------------------------------------------------------------------------------
def api(who: str | None, method: str, path: str, **kw: Any) -> Send:
    """A REST call with `who`'s bearer token (None: no Authorization header). `raw_json`
    sends a body through json.dumps (ASCII escapes, so lone surrogates survive)."""

    def send(w: World) -> Answer:
        headers = {k: w.fill(v) for k, v in kw.get("headers", {}).items()}
        if who is not None:
            headers["Authorization"] = f"Bearer {w.tokens[who]}"
        rest = {k: v for k, v in kw.items() if k not in ("headers", "raw_json")}
        if "raw_json" in kw:
            rest["content"] = json.dumps(kw["raw_json"]).encode()
            headers.setdefault("Content-Type", "application/json")
        with httpx.Client(base_url=w.url, timeout=60) as c:
            return Answer.of(c.request(method, w.fill(path), headers=headers, **rest))

    return send


def console(who: str, method: str, path: str, csrf: str = "own", **kw: Any) -> Send:
    """A console request from `who`'s logged-in browser. `csrf`: "own" sends the session's
    token as the form field (or header, for requests without a form), "none" sends none,
    another browser's name sends that session's token, anything else is sent as is."""

    def send(w: World) -> Answer:
        client, own = w.browsers[who]
        token = {"own": own, "none": None}.get(csrf, csrf)
        if csrf in w.browsers:
            token = w.browsers[csrf][1]
        headers = {k: w.fill(v) for k, v in kw.get("headers", {}).items()}
        rest = {k: v for k, v in kw.items() if k != "headers"}
        if token is not None:
            if "data" in rest or "files" in rest:
                rest["data"] = {**rest.get("data", {}), "csrf": token}
            else:
                headers["X-CSRF-Token"] = token
        r = client.request(method, w.fill(path), headers=headers, follow_redirects=False, **rest)
        return Answer.of(r)

    return send


def raw(method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> Send:
    """One HTTP/1.1 request sent as written (http.client keeps `..` and `%2e` as they are);
    header values may name ids (`{dead_session}`), and `<admin>` is the admin's token."""

    def send(w: World) -> Answer:
        values = {
            k: w.fill(v).replace("<admin>", w.tokens["admin"]) for k, v in (headers or {}).items()
        }
        conn = http.client.HTTPConnection("127.0.0.1", w.server.port, timeout=60)
        try:
            conn.request(method, w.fill(path), body=body or None, headers=values)
            r = conn.getresponse()
            text = r.read().decode(errors="replace")
            return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, text)
        except (ConnectionResetError, BrokenPipeError) as err:  # closed while we sent
            return Answer(0, {}, f"connection closed by the server: {err}")
        finally:
            conn.close()

    return send


def cookie_only(cookie: str, method: str, path: str, **kw: Any) -> Send:
    """A request whose only credential is the session cookie `cookie` (an id such as
    `{dead_session}`, or `<admin>`: the admin's API token where a session id belongs)."""

    def send(w: World) -> Answer:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            c.cookies.set(COOKIE, w.fill(cookie).replace("<admin>", w.tokens["admin"]))
            headers = {k: w.fill(v) for k, v in kw.get("headers", {}).items()}
            rest = {k: v for k, v in kw.items() if k != "headers"}
            if "data" in rest:
                rest["data"] = {k: w.fill(v) for k, v in rest["data"].items()}
            r = c.request(method, w.fill(path), headers=headers, follow_redirects=False, **rest)
            return Answer.of(r)

    return send


# ---- snapshot ------------------------------------------------------------------------------
def listing(c: httpx.Client, path: str) -> list[dict]:
    """Every item of a paginated listing."""
    items: list[dict] = []
    cursor: int | None = 0
    while cursor is not None:
        page = c.get(path, params={"limit": 500, "cursor": cursor})
        assert page.status_code == 200, (path, page.status_code, page.text[:300])
        body = page.json()
        items += body["items"]
        cursor = body["next_cursor"]
    return items


def snapshot(w: World) -> dict[str, Any]:
    """Everything a request could store or change: jobs, services, tokens, nodes (by the
    admin's API reads) and the simulator reports' bytes and owners (on disk)."""
    c = w.admin
    assert c is not None
    jobs = [  # the listing's rows are slim (no spec.args): each job's whole spec by id
        (j["id"], j["queue"], j["state"], c.get(f"/api/v1/jobs/{j['id']}").json()["spec"])
        for j in listing(c, "/api/v1/jobs")
    ]
    services = [
        (s["id"], s["queue"], s["state"], s["spec"]) for s in listing(c, "/api/v1/services")
    ]
    tokens = [(t["id"], t["queue"], t["name"], t["state"]) for t in c.get("/api/v1/tokens").json()]
    nodes = [(n["name"], n["cordoned"], n["health"]) for n in c.get("/api/v1/nodes").json()]
    folder = w.server.home / "sim-reports"
    reports = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}
    return {"jobs": jobs, "services": services, "tokens": tokens, "nodes": nodes, "sim": reports}


def healthy(w: World) -> bool:
    assert w.admin is not None
    r = w.admin.get("/api/v1/health")
    return r.status_code == 200 and r.json() == {"status": "ok"}


def sessions_alive(w: World) -> list[str]:
    """The principals whose console session still works."""
    return [
        who
        for who, (client, _) in w.browsers.items()
        if client.get("/queues", follow_redirects=False).status_code == 200
    ]


# ---- the world -----------------------------------------------------------------------------
def new_token(c: httpx.Client, queue: str | None, name: str, **kw: Any) -> dict:
    r = c.post("/api/v1/tokens", json={"queue": queue, "name": name} | kw)
    assert r.status_code == 201, r.text
    return r.json()


def login(url: str, token: str) -> tuple[httpx.Client, str]:
    """A console client logged in through the form, and its session's CSRF token."""
    client = httpx.Client(base_url=url, timeout=60)
    r = client.post("/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text[:300]
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/submit").text)
    assert found
    return client, found.group(1)


def upload(browser: tuple[httpx.Client, str], name: str) -> None:
    client, csrf = browser
    files = {"report": (name, REPORT, "application/json")}
    r = client.post("/sim", data={"csrf": csrf}, files=files, follow_redirects=False)
    assert r.status_code == 303, r.text[-300:]


def build_world(root: Path) -> World:
    """Start the server and lay out what the attacks aim at: a finished job of team-b
    with output, a pending job in each queue and a pending service of team-b (the node is
    cordoned, so nothing else runs), a report of team-b and one of the admin, tokens
    (live, revoked, expired) and a console session per principal."""
    (root / "queues.yaml").write_text(QUEUES)
    server = ServerProcess(root / "home", "--queues", str(root / "queues.yaml"))
    server.start()
    w = World(server)
    with server.client() as c:
        w.tokens["admin"] = (server.home / "admin.token").read_text().strip()
        for queue in ("team-a", "team-b"):
            w.tokens[queue] = new_token(c, queue, queue)["token"]
        w.ids["token_b"] = new_token(c, "team-b", "team-b-spare")["id"]
        revoked = new_token(c, "team-a", "revoked")
        assert c.delete(f"/api/v1/tokens/{revoked['id']}").status_code == 200
        w.tokens["revoked"] = revoked["token"]
        w.tokens["expired"] = new_token(c, "team-a", "expired", expires_in_s=0.001)["token"]
        w.ids["admin_token"] = next(
            t["id"] for t in c.get("/api/v1/tokens").json() if t["created_by"] == "server"
        )
        body = {"name": "log-b", "queue": "team-b", "script": STEPS, "workdir": WORKDIR}
        headers = {"Authorization": f"Bearer {w.tokens['team-b']}"}
        log_job = c.post("/api/v1/jobs", json=body | {"args": ["--steps", "2"]}, headers=headers)
        assert log_job.status_code == 201, log_job.text
        w.ids["log_job"] = log_job.json()["id"]
        wait_for(c, w.ids["log_job"], {"succeeded"}, timeout_s=120)
        w.ids["node"] = c.get("/api/v1/nodes").json()[0]["name"]
        assert c.post(f"/api/v1/nodes/{w.ids['node']}/cordon").status_code == 200
        for queue, key in (("team-a", "job_a"), ("team-b", "job_b")):
            headers = {"Authorization": f"Bearer {w.tokens[queue]}", "Idempotency-Key": key}
            r = c.post("/api/v1/jobs", json=body | {"queue": queue, "name": key}, headers=headers)
            assert r.status_code == 201, r.text
            w.ids[key] = r.json()["id"]
        service = {"name": "svc-b", "queue": "team-b"}
        r = c.post("/api/v1/services", json=service, headers=headers)
        assert r.status_code == 201, r.text
        w.ids["service_b"] = r.json()["id"]
    w.admin = server.client()
    w.admin.timeout = httpx.Timeout(60)
    w.ids["port"] = str(server.port)
    w.ids["other_port"] = str(server.port + 1)
    for who in ("admin", "team-a", "team-b"):
        w.browsers[who] = login(server.url, w.tokens[who])
    upload(w.browsers["team-b"], "b-report.json")
    upload(w.browsers["admin"], "admin-report.json")
    dead, dead_csrf = login(server.url, w.tokens["team-a"])
    w.ids["dead_session"] = dead.cookies[COOKIE]
    w.ids["dead_csrf"] = dead_csrf
    assert dead.post("/logout", data={"csrf": dead_csrf}, follow_redirects=False).status_code == 303
    time.sleep(0.01)  # the expired token's 1 ms is over
    return w
