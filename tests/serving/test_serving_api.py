"""The OpenAI-compatible API over the real engine: shapes, streaming, 4xx naming the field,
and a client disconnecting mid-stream does not stop the server."""

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
from http_helpers import served

from argosy.serving.api import build_app

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def base_url(smol_engine):
    with served(build_app(smol_engine, MODEL)) as url:
        yield url


def _chat(**extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": "Name a color."}], **extra}


def test_models_lists_the_served_model(base_url):
    data = httpx.get(f"{base_url}/v1/models").json()["data"]
    assert [m["id"] for m in data] == [MODEL]


def test_completion_and_chat_follow_the_openai_schema(base_url):
    body = {"model": MODEL, "prompt": "One, two, three,", "max_tokens": 5, "temperature": 0}
    out = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60).json()
    assert out["object"] == "text_completion" and out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] <= 5
    assert out["usage"]["total_tokens"] == sum(
        out["usage"][k] for k in ("prompt_tokens", "completion_tokens")
    )
    chat = httpx.post(f"{base_url}/v1/chat/completions", json=_chat(max_tokens=6), timeout=60)
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"


def test_streamed_chat_equals_the_full_answer(base_url):
    full = httpx.post(
        f"{base_url}/v1/chat/completions", json=_chat(max_tokens=8, temperature=0), timeout=60
    ).json()["choices"][0]["message"]["content"]
    events = []
    body = _chat(max_tokens=8, temperature=0, stream=True)
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert "".join(c["delta"]["content"] for c in chunks) == full
    assert chunks[-1]["finish_reason"] in {"stop", "length"}


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_stream_usage_counts_the_tokens_of_the_full_answer(base_url, endpoint):
    body = _chat(max_tokens=9, temperature=0)
    if endpoint == "completions":
        body = {"model": MODEL, "prompt": "One, two, three,", "max_tokens": 9, "temperature": 0}
    full = httpx.post(f"{base_url}/v1/{endpoint}", json=body, timeout=60).json()
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{base_url}/v1/{endpoint}", json=streamed, timeout=60) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"] == full["usage"]
    assert all("usage" not in json.loads(e) for e in events[:-2])
    bad = {**streamed, "stream_options": {"include_usage": True, "extra": 1}}
    assert httpx.post(f"{base_url}/v1/{endpoint}", json=bad, timeout=60).status_code == 400


@pytest.mark.parametrize(
    ("body", "want_status", "want_param"),
    [
        (_chat(model="gpt-9"), 404, "model"),
        (_chat(temperature=3), 400, "temperature"),
        (_chat(top_p=0), 400, "top_p"),
        (_chat(max_tokens=0), 400, "max_tokens"),
        (_chat(max_token=5), 400, "max_token"),
        (_chat(speculative="eagle9"), 400, "speculative"),
        ({"model": MODEL, "prompt": "word " * 600}, 400, "prompt"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
    ],
    ids=[
        "unknown-model",
        "temperature",
        "top_p",
        "max_tokens",
        "typo",
        "proposer",
        "oversized",
        "no-messages",
    ],
)
def test_bad_requests_name_the_field(base_url, body, want_status, want_param):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    resp = httpx.post(f"{base_url}{path}", json=body, timeout=60)
    assert resp.status_code == want_status
    assert resp.json()["error"]["param"] == want_param


def test_malformed_json_is_a_400(base_url):
    resp = httpx.post(
        f"{base_url}/v1/chat/completions",
        content=b'{"model": "smollm2-135m", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400
    assert "malformed JSON" in resp.json()["error"]["message"]


def test_disconnect_mid_stream_leaves_the_server_serving(base_url, smol_engine):
    before = smol_engine.stats().requests
    body = _chat(
        max_tokens=200,
        temperature=0,
        stream=True,
        messages=[{"role": "user", "content": "Write a long story about a ship."}],
    )
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as resp:
        next(resp.iter_lines())  # one event, then hang up
    other = httpx.post(f"{base_url}/v1/chat/completions", json=_chat(max_tokens=4), timeout=60)
    assert other.status_code == 200
    deadline = time.time() + 30
    while smol_engine.stats().requests < before + 2 and time.time() < deadline:
        time.sleep(0.1)
    assert smol_engine.stats().requests == before + 2  # the abandoned one was closed
    assert smol_engine.stats().completion_tokens < 200 * 2
    metrics = httpx.get(f"{base_url}/metrics").text
    assert "argosy_serving_ttft_seconds" in metrics


@pytest.mark.parametrize(
    "args", [["--speculative", "eagle9"], ["--model", "no-such-model"], ["--engine", "nope"]]
)
def test_cli_usage_errors_exit_2_with_one_line(args):
    result = subprocess.run(
        [sys.executable, "-m", "argosy", "serve", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_32_concurrent_streaming_clients_all_finish(base_url, smol_engine):
    num_clients = 32
    results: list = [None] * num_clients

    def client(i):
        body = _chat(  # long enough answers that the 32 overlap whatever their speculation
            max_tokens=12,
            temperature=0,
            stream=True,
            messages=[{"role": "user", "content": f"Count from {i} to {i + 40}, one per line."}],
        )
        start = time.perf_counter()
        first = None
        with httpx.stream(
            "POST", f"{base_url}/v1/chat/completions", json=body, timeout=300
        ) as resp:
            lines = []
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    first = first or time.perf_counter() - start
                    lines.append(line[6:])
        results[i] = (resp.status_code, lines, first)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(num_clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert all(r is not None and r[0] == 200 for r in results), results
    assert all(r[1][-1] == "[DONE]" and len(r[1]) >= 2 for r in results)
    ttfts = sorted(r[2] for r in results)
    print(f"32 clients: TTFT p50 {ttfts[15]:.2f} s, p99 {ttfts[-1]:.2f} s")
    assert smol_engine.stats().batched_steps > 0  # they were decoded together
