"""A request's `speculative` picks among the proposers its service offers, by name only:
never a path (`draft:PATH` made the worker load any directory it could read, kept for the
process's life outside the memory budget), never a proposer the service was not started
with. Refusals are 400s naming the field and listing what is offered, before the engine
sees the request; an `ArgosyError` raised while the engine builds a request is a 400 too,
never a 500. Over a stand-in engine (no model)."""

import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient

from argosy.core.errors import ConfigError
from argosy.serving.api import build_app
from argosy.serving.config import EngineConfig

MODEL = "fake"


class ConfiguredEngine(FakeEngine):
    """The stand-in engine with the setting the service was started with."""

    def __init__(self, speculative: str) -> None:
        super().__init__(hold_streams=False)
        self.config = EngineConfig(speculative=speculative)


def _client(engine):
    app = build_app(engine, MODEL)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


def _ask(client, speculative, endpoint="chat", **extra):
    if endpoint == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        path = "/v1/chat/completions"
    else:
        body = {"model": MODEL, "prompt": "hi"}
        path = "/v1/completions"
    if speculative is not None:
        body["speculative"] = speculative
    return client.post(path, json={**body, "max_tokens": 2, **extra})


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_naming_a_draft_path_is_a_400_and_reaches_no_engine(tmp_path, endpoint, stream):
    checkpoint = tmp_path / "ckpt"  # a directory a draft could be loaded from
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    engine = ConfiguredEngine("auto")
    with _client(engine) as client:
        for spec in (f"draft:{checkpoint}", "draft:/etc", "DRAFT:/nowhere", "self:1", "ngram:x"):
            resp = _ask(client, spec, endpoint, stream=stream)
            assert resp.status_code == 400, (spec, resp.text)
            error = resp.json()["error"]
            assert error["param"] == "speculative"
            assert "never a path" in error["message"]
            assert "off, auto, ngram" in error["message"]  # what this service offers
            assert str(checkpoint) not in error["message"]
    assert engine.requests == [] and engine.started == 0  # nothing reached the engine


@pytest.mark.parametrize(
    ("configured", "requested", "runs"),
    [
        ("auto", None, None),  # the service's own setting
        ("auto", "off", "off"),
        ("auto", "auto", "auto"),
        ("auto", "adaptive", "auto"),
        ("auto", "ngram", "ngram"),
        ("auto", "prompt-lookup", "ngram"),
        ("ngram", "auto", "auto"),
        ("off", "off", "off"),
        ("self", "early-exit", "self"),
        ("self:2", "self", "self:2"),  # the service's own depth
        ("draft:/srv/draft", "draft", "draft:/srv/draft"),  # the service's own checkpoint
        ("draft:/srv/draft", "ngram", "ngram"),
    ],
)
def test_a_request_chooses_among_the_services_proposers(configured, requested, runs):
    engine = ConfiguredEngine(configured)
    with _client(engine) as client:
        resp = _ask(client, requested)
    assert resp.status_code == 200, resp.text
    assert [r.speculative for r in engine.requests] == [runs]


@pytest.mark.parametrize(
    ("configured", "requested", "offered"),
    [
        ("auto", "self", "off, auto, ngram"),
        ("auto", "draft", "off, auto, ngram"),
        ("auto", "eagle9", "off, auto, ngram"),
        ("off", "ngram", "off"),
        ("off", "auto", "off"),
        ("self:2", "draft", "off, auto, ngram, self"),
        ("self:2", "self:1", "off, auto, ngram, self"),
        ("draft:/srv/draft", "self", "off, auto, ngram, draft"),
        ("draft:/srv/draft", "draft:/srv/draft", "off, auto, ngram, draft"),
        ("draft:/srv/draft", "draft:/srv/other", "off, auto, ngram, draft"),
    ],
)
def test_a_proposer_the_service_does_not_offer_is_a_400_listing_what_it_offers(
    configured, requested, offered
):
    engine = ConfiguredEngine(configured)
    with _client(engine) as client:
        resp = _ask(client, requested)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "speculative"
    assert error["message"].endswith(offered)
    assert "/srv" not in error["message"]  # neither the request's path nor the service's
    assert engine.requests == []


def test_an_engine_that_does_not_say_what_it_runs_offers_only_off():
    engine = FakeEngine(hold_streams=False)  # no `config`
    with _client(engine) as client:
        assert _ask(client, "ngram").status_code == 400
        assert _ask(client, "off").status_code == 200


class RefusingEngine(ConfiguredEngine):
    """An engine whose request building raises an `ArgosyError` (a proposer it cannot
    build), as the worker's rebuilt `ConfigError` does."""

    def stream(self, request):
        raise ConfigError("speculative 'self' needs an engine that exposes its model")
        yield  # a generator, like the real engines


@pytest.mark.parametrize("stream", [False, True])
def test_an_argosy_error_while_the_engine_builds_a_request_is_a_400_not_a_500(stream):
    with _client(RefusingEngine("auto")) as client:
        resp = _ask(client, None, stream=stream)
    assert resp.status_code == 400, resp.text
    assert "exposes its model" in resp.json()["error"]["message"]
