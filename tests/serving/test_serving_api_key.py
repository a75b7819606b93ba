"""The API key of `argosy serve`: `/v1/*` needs `Authorization: Bearer <key>` when a key is
set (what the official `openai` SDK sends), probes stay open, and the key comes from the
environment or a file, never the command line."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from fake_engine import FakeEngine
from http_helpers import served

from argosy.core.errors import ArgosyError
from argosy.serving.api import build_app
from argosy.serving.api_key import ENV_API_KEY, read_key

MODEL = "fake"
KEY = "sk-argosy-test-0123456789"
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def url():
    with served(build_app(FakeEngine(hold_streams=False), MODEL, api_key=KEY)) as base:
        yield base


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
     {"Authorization": f"Bearer {KEY}x"}, {"Authorization": KEY}],
    ids=["none", "wrong", "not-bearer", "longer", "no-scheme"],
)  # fmt: skip
def test_v1_without_the_key_is_401_before_anything_runs(url, headers) -> None:
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions")):
        r = httpx.request(method, url + path, json=BODY, headers=headers, timeout=30)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert KEY not in r.text


def test_the_key_opens_v1_and_probes_need_none(url) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(url + "/v1/models", headers=auth).status_code == 200
    r = httpx.post(url + "/v1/completions", json=BODY, headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    for probe in ("/live", "/health", "/metrics"):
        assert httpx.get(url + probe).status_code == 200, probe


def test_the_openai_sdk_sends_its_api_key(url) -> None:
    good = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in good.models.list().data] == [MODEL]
    bad = openai.OpenAI(base_url=url + "/v1", api_key="sk-other", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_without_a_key_every_request_passes() -> None:
    with served(build_app(FakeEngine(hold_streams=False), MODEL)) as base:
        assert httpx.get(base + "/v1/models").status_code == 200


def test_the_key_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(f"{KEY}\n")
    assert read_key(path, {ENV_API_KEY: "other"}) == KEY  # the file wins
    assert read_key(None, {ENV_API_KEY: " env-key "}) == "env-key"
    assert read_key(None, {}) is None
    path.write_text("\n")
    with pytest.raises(ArgosyError, match="is empty"):
        read_key(path, {})
    with pytest.raises(ArgosyError, match="No such file"):
        read_key(tmp_path / "missing", {})
