"""What clients see of a sleeping engine, over a stand-in engine: new requests (streams
included) get a 503 with Retry-After before any byte of a stream; a stream cut by a sleep
ends with an SSE error event, which the official SDK raises as an API error (not a
connection error it would retry); `/health` is a 503 while `/live` stays 200."""

import json
import threading
import time

import httpx
import openai
import pytest
from fake_engine import FakeEngine
from http_helpers import served

from argosy.serving.api import build_app
from argosy.serving.limits import ServingLimits

MODEL = "fake"


@pytest.fixture
def setup():
    engine = FakeEngine()
    limits = ServingLimits(asleep_retry_after_s=12)
    with served(build_app(engine, MODEL, limits=limits)) as url:
        yield engine, url


def _chat(**extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_requests_while_asleep_are_a_503_with_retry_after(setup, stream, route):
    engine, url = setup
    engine.asleep = True
    body = _chat(stream=stream) if route.startswith("chat") else {
        "model": MODEL, "prompt": "hi", "stream": stream
    }  # fmt: skip
    resp = httpx.post(f"{url}/v1/{route}", json=body, timeout=10)
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "12"
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"]["type"] == "service_unavailable"
    assert engine.encoded == 0  # refused before tokenizing


def test_health_is_503_asleep_and_live_stays_200(setup):
    engine, url = setup
    assert httpx.get(f"{url}/health").status_code == 200
    engine.asleep = True
    health = httpx.get(f"{url}/health")
    assert health.status_code == 503 and health.json()["status"] == "asleep"
    assert health.headers["retry-after"] == "12"
    assert httpx.get(f"{url}/live").status_code == 200
    engine.asleep = False
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_stream_cut_by_sleep_ends_with_an_error_event(setup):
    engine, url = setup
    engine.cut = True
    events = []

    def release():
        time.sleep(0.3)
        engine.gate.set()

    threading.Thread(target=release, daemon=True).start()
    body = _chat(stream=True)
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["type"] == "service_unavailable"
    assert last["error"]["code"] == "engine_asleep"
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"


def test_the_sdk_raises_an_api_error_for_a_cut_stream_and_a_503_when_asleep(setup):
    engine, url = setup
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    engine.cut = True
    engine.gate.set()
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIError) as cut:
        list(stream)
    assert not isinstance(cut.value, openai.APIConnectionError)
    engine.asleep = True
    with pytest.raises(openai.InternalServerError) as asleep:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert asleep.value.status_code == 503


@pytest.mark.parametrize("fault", [OSError("/models/secret-path: gone"), IndexError("range")])
def test_any_engine_fault_mid_stream_ends_it_with_an_error_event(setup, fault):
    """Whatever the engine raises after the first chunk, the stream ends with an SSE error
    event naming its kind (not its words, which may hold paths), never a cut connection."""
    engine, url = setup
    engine.fault = fault
    engine.gate.set()
    body = _chat(stream=True)
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    last = json.loads(events[-1])
    assert last["error"]["code"] == "engine_error"
    assert type(fault).__name__ in last["error"]["message"]
    assert str(fault) not in last["error"]["message"]
    assert httpx.get(f"{url}/health").status_code == 200  # and the service serves on
