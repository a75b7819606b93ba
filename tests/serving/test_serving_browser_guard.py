"""`argosy serve` against browsers: without an API key it answers only Host names that a
DNS rebinding attack cannot use (localhost, IP addresses, ARGOSY_SERVE_ALLOWED_HOSTS) and
refuses cross-site requests; with a key it behaves as before. Every answer carries
`nosniff` and `X-Frame-Options: DENY`."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient

from argosy.serving.api import ENV_ALLOWED_HOSTS, build_app

MODEL = "fake"
KEY = "sk-argosy-test-0123456789"
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
REBIND = "http://rebind.attacker.example:8000"


def client(base_url: str, api_key: str | None = None) -> tuple[TestClient, FakeEngine]:
    engine = FakeEngine(hold_streams=False)
    return TestClient(build_app(engine, MODEL, api_key=api_key), base_url=base_url), engine


def assert_hardened(response) -> None:  # noqa: ANN001
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"


def test_a_rebinding_host_is_refused_before_the_engine_runs() -> None:
    c, engine = client(REBIND)
    r = c.post("/v1/completions", json=BODY, headers={"origin": REBIND})
    assert r.status_code == 421, r.text
    error = r.json()["error"]
    assert error["code"] == "host_not_allowed"
    assert "rebind.attacker.example" in error["message"] and ENV_ALLOWED_HOSTS in error["message"]
    assert engine.encoded == 0 and engine.requests == []
    assert_hardened(r)
    for path in ("/v1/models", "/metrics", "/health"):
        assert c.get(path).status_code == 421, path


@pytest.mark.parametrize(
    "headers",
    [{"origin": "http://evil.example"}, {"origin": "null"},
     {"origin": "http://localhost:9999"}, {"sec-fetch-site": "cross-site"},
     {"sec-fetch-site": "same-site"}],
    ids=["origin", "null-origin", "other-port", "fetch-cross-site", "fetch-same-site"],
)  # fmt: skip
def test_a_cross_site_request_is_refused(headers: dict[str, str]) -> None:
    c, engine = client("http://localhost:8000")
    r = c.post("/v1/completions", json=BODY, headers=headers)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "cross_site_request"
    assert engine.encoded == 0
    assert_hardened(r)
    assert c.get("/v1/models", headers=headers).status_code == 403


@pytest.mark.parametrize(
    "base_url",
    ["http://localhost:8000", "http://127.0.0.1:8000", "http://[::1]:8000",
     "http://LOCALHOST.", "http://192.168.1.5:8000", "http://[fd00::5]"],
)  # fmt: skip
def test_localhost_and_addresses_are_served(base_url: str) -> None:
    c, _ = client(base_url)
    same = {"origin": base_url.lower(), "sec-fetch-site": "same-origin"}
    for headers in ({}, same):
        r = c.post("/v1/completions", json=BODY, headers=headers)
        assert r.status_code == 200, (headers, r.text)
        assert_hardened(r)
    navigation = c.get("/v1/models", headers={"sec-fetch-site": "none"})  # a typed URL
    assert navigation.status_code == 200
    assert_hardened(navigation)


def test_configured_names_are_served_and_others_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_ALLOWED_HOSTS, "llm.internal, Models.Example.org:8000")
    for base_url in ("http://llm.internal:8000", "http://models.example.org"):
        c, _ = client(base_url)
        assert c.post("/v1/completions", json=BODY).status_code == 200, base_url
    c, _ = client("http://example.org")
    assert c.post("/v1/completions", json=BODY).status_code == 421


def test_with_an_api_key_the_key_is_the_guard_and_answers_are_hardened() -> None:
    c, _ = client(REBIND, api_key=KEY)
    refused = c.post("/v1/completions", json=BODY)
    assert refused.status_code == 401
    assert_hardened(refused)
    auth = {"authorization": f"Bearer {KEY}", "origin": "http://evil.example"}
    r = c.post("/v1/completions", json=BODY, headers=auth)
    assert r.status_code == 200, r.text
    assert_hardened(r)


def test_every_answer_is_hardened() -> None:
    c, _ = client("http://localhost:8000")
    for r in (c.get("/live"), c.get("/nope"), c.post("/v1/completions", json={"model": "x"})):
        assert r.status_code in (200, 400, 404), r.text
        assert_hardened(r)
