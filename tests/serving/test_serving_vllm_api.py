"""`argosy serve --engine vllm` end to end: the real CLI in a subprocess over vLLM(-CPU),
the OpenAI API (chat and completions, streamed and not), vLLM's n-gram speculation, a
client hanging up mid-stream, and sleep/wake through the admin API.

Runs where `import vllm` works (`.venv-vllm`, made by `scripts/setup_vllm.sh`); skips
elsewhere, as in CI.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed here (bash scripts/setup_vllm.sh, then .venv-vllm)",
    ),
]

MODEL = "smollm2-135m"
START_LIMIT_S = 900.0
"""vLLM's import and engine build: ~1 min on two idle cores, minutes under load. Every
request below has its own client timeout, so no test waits forever."""
TOKEN = "vllm-test"
PARAGRAPH = (
    "The harbour at Kestrel Point was built in 1871 to shelter the herring fleet. Its granite "
    "breakwater runs four hundred metres to the north-east and ends in a small white lighthouse."
)


@pytest.fixture(scope="module")
def base_url():
    httpx = pytest.importorskip("httpx")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "ARGOSY_ADMIN_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "argosy", "serve", "--engine", "vllm", "--model", MODEL]
    server = subprocess.Popen(
        [*cmd, "--port", str(port), "--speculative", "ngram"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(httpx, server, base, START_LIMIT_S)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=60)


def _wait_healthy(httpx, server, base, limit_s):
    """Return once /health answers 200; fail clearly if the server exits or takes longer."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        assert server.poll() is None, "argosy serve --engine vllm exited during start-up"
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"argosy serve --engine vllm was not healthy within {limit_s:.0f} s")


def _chat(text="Name a color.", **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def _post(base_url, path, body):
    import httpx

    return httpx.post(f"{base_url}{path}", json=body, timeout=300)


def _events(base_url, path, body):
    import httpx

    with httpx.stream("POST", f"{base_url}{path}", json=body, timeout=300) as resp:
        assert resp.status_code == 200
        return [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]


def test_models_lists_the_served_model(base_url):
    import httpx

    data = httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"]
    assert [m["id"] for m in data] == [MODEL]


def test_completion_streamed_and_not_give_the_same_greedy_text(base_url):
    body = {"model": MODEL, "prompt": "One, two, three,", "max_tokens": 6, "temperature": 0}
    out = _post(base_url, "/v1/completions", body).json()
    assert out["object"] == "text_completion"
    usage = out["usage"]
    assert 1 <= usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    events = _events(base_url, "/v1/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert len(chunks) >= 2  # tokens arrive as vLLM decides them, not in one piece
    assert "".join(c["text"] for c in chunks) == out["choices"][0]["text"]
    assert chunks[-1]["finish_reason"] == out["choices"][0]["finish_reason"]


def test_chat_streamed_and_not_give_the_same_greedy_answer(base_url):
    full = _post(base_url, "/v1/chat/completions", _chat(max_tokens=8, temperature=0)).json()
    message = full["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    streamed = _chat(max_tokens=8, temperature=0, stream=True)
    events = _events(base_url, "/v1/chat/completions", streamed)
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert "".join(c["delta"]["content"] for c in chunks) == message["content"]
    assert chunks[-1]["finish_reason"] in {"stop", "length"}


def test_copying_prompt_accepts_ngram_drafts(base_url):
    import httpx

    def accepted() -> float:
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
        line = next(x for x in text.splitlines() if x.startswith("argosy_serving_spec_accepted"))
        return float(line.split()[-1])

    before = accepted()
    text = f"{PARAGRAPH}\n\nRepeat the paragraph above word for word."
    out = _post(base_url, "/v1/chat/completions", _chat(text, max_tokens=24, temperature=0))
    assert out.status_code == 200
    assert accepted() > before  # vLLM's prompt-lookup drafts were verified and kept


def test_bad_input_is_a_4xx_naming_the_field(base_url):
    resp = _post(base_url, "/v1/chat/completions", _chat(temperature=3))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "temperature"
    resp = _post(base_url, "/v1/completions", {"model": MODEL, "prompt": "word " * 9000})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"


def test_hang_up_mid_stream_leaves_the_server_serving(base_url):
    import httpx

    body = _chat("Write a long story about a ship.", max_tokens=200, temperature=0, stream=True)
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=300) as resp:
        next(resp.iter_lines())  # one event, then hang up
    other = _post(base_url, "/v1/chat/completions", _chat(max_tokens=4))
    assert other.status_code == 200


def test_sleep_refuses_requests_and_wake_serves_the_same_answer(base_url):
    import httpx

    auth = {"authorization": f"Bearer {TOKEN}"}
    want = _post(base_url, "/v1/chat/completions", _chat(max_tokens=6, temperature=0)).json()
    slept = httpx.post(f"{base_url}/admin/sleep", json={"level": 1}, headers=auth, timeout=300)
    assert slept.status_code == 200
    assert slept.json()["resident_bytes"] < slept.json()["resident_bytes_before"]
    assert _post(base_url, "/v1/chat/completions", _chat(max_tokens=2)).status_code == 503
    woke = httpx.post(f"{base_url}/admin/wake", headers=auth, timeout=600)
    assert woke.status_code == 200
    got = _post(base_url, "/v1/chat/completions", _chat(max_tokens=6, temperature=0)).json()
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
