"""The HTTP guards against a real `argosy server` process (uvicorn, real sockets): bodies
over `max_body_bytes` are refused at once with a small 413, whether Content-Length
announces them or they stream in chunks; bodies up to the cap are read and answered
as usual; the console's origin check uses the real Host and port; nothing of this
leaves a traceback in the server's log. (The guards' rules one by one, in-process:
tests/console/test_console_guards.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import ServerProcess, running_server

LIMIT = 1 << 20  # ServerConfig.max_body_bytes's default
TEN_MB = 10 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from running_server(tmp_path_factory.mktemp("guards") / "home")


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def server_log(server: ServerProcess) -> str:
    return (server.home.parent / f"server-{server.port}.log").read_text(errors="replace")


def login_client(client: httpx.Client, token: str) -> str:
    """Log in through the console's form, as a browser does; the session's CSRF token."""
    assert client.post("/login", data={"token": token}).status_code == 303
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/submit").text)
    assert found
    return found.group(1)


def body_of_size(size: int) -> bytes:
    """A JSON job body of exactly `size` bytes (its name too long to be valid)."""
    head, tail = b'{"script": "x.py", "name": "', b'"}'
    return head + b"n" * (size - len(head) - len(tail)) + tail


def chunks(data: bytes, size: int = 64 << 10) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def post_job(api: httpx.Client, body: bytes, chunked: bool) -> httpx.Response:
    content = chunks(body) if chunked else body
    return api.post("/api/v1/jobs", content=content, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_10mb_body_is_refused_at_once_with_a_small_answer(server, api, chunked) -> None:
    start = time.monotonic()
    r = post_job(api, body_of_size(TEN_MB), chunked)
    elapsed_s = time.monotonic() - start
    assert r.status_code == 413, r.text[:300]
    assert r.json() == {"detail": f"request body over the limit of {LIMIT} bytes (max_body_bytes)"}
    assert len(r.content) < 200 and elapsed_s < 5.0
    assert r.headers["x-content-type-options"] == "nosniff"
    listing = api.get("/api/v1/jobs")
    assert listing.status_code == 200 and len(listing.content) < 100_000
    assert "Traceback" not in server_log(server)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.one_of(st.integers(LIMIT - 2, LIMIT + 2), st.integers(LIMIT - 8192, LIMIT + 8192)),
    chunked=st.booleans(),
)
def test_the_cap_falls_exactly_at_max_body_bytes(api, size: int, chunked: bool) -> None:
    r = post_job(api, body_of_size(size), chunked)
    if size > LIMIT:
        assert r.status_code == 413, (size, r.text[:200])
    else:
        assert r.status_code == 422, (size, r.text[:200])  # read, parsed, refused by field
        (error,) = r.json()["detail"]
        assert error["loc"] == ["body", "name"] and "input" not in error
    assert len(r.content) < 1000


def test_the_console_answers_oversized_forms_with_a_413_page(server) -> None:
    token = (server.home / "admin.token").read_text().strip()
    with httpx.Client(base_url=server.url) as browser:
        r = browser.post("/login", data={"token": "t" * TEN_MB})
        assert r.status_code == 413 and r.headers["content-type"].startswith("text/html")
        assert f"limit of {LIMIT} bytes" in r.text and len(r.content) < 500
        csrf = login_client(browser, token)
        r = browser.post("/submit", data={"yaml": "y" * TEN_MB, "csrf": csrf})
        assert r.status_code == 413 and f"limit of {LIMIT} bytes" in r.text
        assert browser.get("/jobs").status_code == 200  # still logged in, server well
    assert "Traceback" not in server_log(server)


def test_the_origin_check_uses_the_real_host_and_port(server, api) -> None:
    token = (server.home / "admin.token").read_text().strip()
    node = api.get("/api/v1/nodes").json()[0]["name"]
    port = server.port
    with httpx.Client(base_url=server.url) as browser:
        csrf = login_client(browser, token)
        for origin in (f"http://127.0.0.1:{port + 1}", f"http://localhost:{port}", "null"):
            headers = {"Origin": origin, "X-CSRF-Token": csrf}
            r = browser.post(f"/nodes/{node}/cordon", headers=headers, follow_redirects=False)
            assert r.status_code == 403 and "cross-site request refused" in r.text, origin
        assert not any(n["cordoned"] for n in api.get("/api/v1/nodes").json())
        own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        for action in ("cordon", "uncordon"):
            headers = own | {"X-CSRF-Token": csrf}
            r = browser.post(f"/nodes/{node}/{action}", headers=headers, follow_redirects=False)
            assert r.status_code == 303, r.text[:300]
    items = api.get("/api/v1/events", params={"limit": 500}).json()["items"]
    changes = [(e["kind"], e["actor"]) for e in items if e["message"] == f"node {node}"]
    assert changes == [("cordoned", "admin"), ("uncordoned", "admin")]
