"""The HTTP layer under load, over a stand-in engine (no model): the probes and the model
list answer while every stream and the tokenizer are held; a full queue is a 429 with
Retry-After; bodies and prompts over their limits are refused before tokenizing; big
bodies hand their memory back; the worker process keeps `stats` apart from streams.
These test the mechanism; benchmarks/serving_load.py measures the latencies."""

import json
import multiprocessing
import threading
import time

import httpx
import pytest
from async_helpers import run_async
from fake_engine import FakeEngine
from http_helpers import served
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.serving.api import build_app
from argosy.serving.limits import BodyLimit, ServingLimits
from argosy.serving.types import GenerationChunk, GenerationRequest, SamplingParams
from argosy.serving.worker import _serve_messages

MODEL = "fake"
PROBES = ["/live", "/health", "/v1/models", f"/v1/models/{MODEL}", "/metrics"]


def _chat(content="hi", **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def _open_streams(url, count, results):
    """`count` streaming clients on threads; each records its status and events."""

    def client(i):
        body = _chat(f"client {i}", stream=True)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as resp:
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
            results[i] = (resp.status_code, events)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def _wait_for(predicate, limit_s=30.0):
    deadline = time.time() + limit_s
    while not predicate() and time.time() < deadline:
        time.sleep(0.02)
    assert predicate()


def test_probes_answer_while_every_stream_and_the_tokenizer_are_held():
    engine = FakeEngine()
    limits = ServingLimits(max_pending_requests=200, tokenize_threads=2)
    with served(build_app(engine, MODEL, limits=limits)) as url:
        results = {}
        threads = _open_streams(url, 72, results)  # more than any shared pool held
        _wait_for(lambda: engine.started == 72)
        engine.hold_tokenizer = True  # and the tokenizer threads are stuck too
        stuck = [
            threading.Thread(
                target=httpx.post,
                args=(f"{url}/v1/chat/completions",),
                kwargs={"json": _chat(), "timeout": 60},
                daemon=True,
            )
            for _ in range(4)
        ]
        for thread in stuck:
            thread.start()
        _wait_for(lambda: engine.encoded >= 72 + 2)
        for path in PROBES:
            resp = httpx.get(f"{url}{path}", timeout=5)  # a stall here would time out
            assert resp.status_code == 200, (path, resp.text)
        assert httpx.get(f"{url}/health", timeout=5).json()["in_flight"] >= 72
        assert "argosy_serving_http_in_flight" in httpx.get(f"{url}/metrics", timeout=5).text
        engine.tokenizer_gate.set()
        engine.gate.set()
        for thread in threads + stuck:
            thread.join(timeout=60)
    assert all(status == 200 and events[-1] == "[DONE]" for status, events in results.values())


def test_a_full_queue_is_a_429_with_retry_after_and_frees_when_streams_end():
    engine = FakeEngine()
    limits = ServingLimits(max_pending_requests=3, retry_after_s=7)
    with served(build_app(engine, MODEL, limits=limits)) as url:
        results = {}
        threads = _open_streams(url, 3, results)
        _wait_for(lambda: engine.started == 3)
        for body in (_chat(), _chat(stream=True)):
            resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5)
            assert resp.status_code == 429 and resp.headers["retry-after"] == "7"
            assert resp.json()["error"]["type"] == "rate_limit_error"
        assert engine.started == 3
        engine.gate.set()
        for thread in threads:
            thread.join(timeout=30)
        assert httpx.post(f"{url}/v1/chat/completions", json=_chat(), timeout=10).is_success


def test_oversized_bodies_are_a_413_naming_the_limit_and_never_tokenized():
    engine = FakeEngine(hold_streams=False)
    limits = ServingLimits(max_body_bytes=4096)
    with served(build_app(engine, MODEL, limits=limits)) as url:
        big = json.dumps(_chat("x" * 10_000)).encode()
        declared = httpx.post(f"{url}/v1/chat/completions", content=big, timeout=10)

        def chunked():  # no Content-Length: counted as it streams in
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        streamed = httpx.post(f"{url}/v1/chat/completions", content=chunked(), timeout=10)
        for resp in (declared, streamed):
            assert resp.status_code == 413
            assert resp.json()["error"]["param"] == "max_body_bytes"
            assert "4096" in resp.json()["error"]["message"]
        assert engine.encoded == 0
        ok = httpx.post(f"{url}/v1/chat/completions", json=_chat("x" * 100), timeout=10)
        assert ok.status_code == 200 and engine.encoded == 1


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_prompts_over_the_character_limit_are_a_400_before_tokenizing(route):
    engine = FakeEngine(hold_streams=False)
    limits = ServingLimits(max_prompt_chars=500)
    with served(build_app(engine, MODEL, limits=limits)) as url:
        field = "prompt" if route == "completions" else "messages"
        body = {"model": MODEL, "prompt": "y" * 501} if field == "prompt" else _chat("y" * 501)
        resp = httpx.post(f"{url}/v1/{route}", json=body, timeout=10)
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["param"] == field and "max_prompt_chars" in error["message"]
        assert engine.encoded == 0


def test_big_bodies_trim_the_heap_after_the_response_and_small_ones_do_not():
    trims = []

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = BodyLimit(app, max_bytes=10_000, trim_after_bytes=1000, trim=lambda: trims.append(1))

    async def post(size):
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/", content=b"z" * size)

    assert run_async(post(999)).status_code == 200 and trims == []
    assert run_async(post(1000)).status_code == 200 and trims == [1]


@settings(max_examples=40, deadline=None)
@given(limit=st.integers(1024, 8192), size=st.integers(0, 12_000), chunk=st.integers(1, 5000))
def test_the_body_limit_refuses_exactly_the_bodies_over_it(limit, size, chunk):
    seen = []

    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(len(body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = BodyLimit(app, max_bytes=limit)
    data = b"q" * size

    async def post():
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            declared = await client.post("/", content=data)

            async def pieces():
                for i in range(0, size, chunk):
                    yield data[i : i + chunk]

            streamed = await client.post("/", content=pieces())
            return declared.status_code, streamed.status_code

    declared, streamed = run_async(post())
    want = 413 if size > limit else 200
    assert (declared, streamed) == (want, want)
    assert all(n <= limit for n in seen)


class _HeldEngine:
    """For the worker's message loop: streams wait on a gate; stats answer at once."""

    def __init__(self):
        self.gate = threading.Event()

    def stream(self, request):
        self.gate.wait(60)
        yield GenerationChunk((1,), "a", "stop")

    def stats(self):
        return "stats"


def test_the_worker_answers_stats_while_more_streams_run_than_any_pool_had():
    parent, child = multiprocessing.Pipe()
    engine = _HeldEngine()

    def send(message):
        child.send(message)

    loop = threading.Thread(
        target=_serve_messages, args=(child, engine, send, lambda code: None), daemon=True
    )
    loop.start()
    request = GenerationRequest((1, 2), SamplingParams(max_tokens=1))
    for rid in range(1, 101):
        parent.send(("stream", rid, request))
    parent.send(("call", 999, "stats", ()))
    assert parent.poll(10), "stats waited for the streams"
    assert parent.recv() == ("ok", 999, "stats")
    engine.gate.set()
    ends = set()
    while len(ends) < 100 and parent.poll(10):
        kind, rid, _ = parent.recv()
        if kind == "end":
            ends.add(rid)
    assert len(ends) == 100
    parent.send(("exit", 0, None))
    loop.join(timeout=10)
    assert not loop.is_alive()
