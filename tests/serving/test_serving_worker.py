"""The engine in a worker process behind the HTTP API: answers, admin sleep levels 1 and 2
(level 2 gives back nearly all of the service's memory), 503 while asleep, token checks."""

import os

import httpx
import pytest
from http_helpers import served

from argosy.core.errors import ConfigError, UnknownNameError
from argosy.serving import EngineConfig
from argosy.serving.api import build_app
from argosy.serving.worker import WorkerEngine

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
TOKEN = "s3cret"


@pytest.fixture(scope="module")
def worker():
    engine = WorkerEngine(EngineConfig(model=MODEL, speculative="auto", num_threads=1))
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def base_url(worker):
    with served(build_app(worker, MODEL, admin_token=TOKEN)) as url:
        yield url


def _ask(base_url, content="What is the capital of France?", max_tokens=8):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def _admin(base_url, path, token=TOKEN, **body):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{base_url}/admin/{path}", json=body, headers=headers, timeout=300)


def test_the_worker_is_its_own_process_and_answers(worker, base_url):
    assert worker.worker_pid not in (None, os.getpid())
    answer = _ask(base_url).json()["choices"][0]["message"]["content"]
    assert "Paris" in answer


def test_admin_routes_need_the_token(base_url):
    assert _admin(base_url, "sleep", token=None).status_code == 401
    denied = _admin(base_url, "sleep", token="wrong")
    assert denied.status_code == 401 and denied.json()["error"]["param"] == "authorization"
    assert _admin(base_url, "sleep", level=3).status_code == 400


def test_sleep_level_1_keeps_the_worker_and_wake_gives_the_same_answer(worker, base_url):
    want = _ask(base_url).json()["choices"][0]["message"]["content"]
    pid = worker.worker_pid
    slept = _admin(base_url, "sleep", level=1).json()
    assert slept["state"] == "asleep" and slept["level"] == 1
    assert slept["resident_bytes"] < slept["resident_bytes_before"]
    busy = _ask(base_url)
    assert busy.status_code == 503 and "asleep" in busy.json()["error"]["message"]
    assert _admin(base_url, "wake").json()["state"] == "awake"
    assert worker.worker_pid == pid
    assert _ask(base_url).json()["choices"][0]["message"]["content"] == want


def test_sleep_level_2_stops_the_worker_and_frees_most_memory(worker, base_url):
    want = _ask(base_url).json()["choices"][0]["message"]["content"]
    served_before = worker.stats().requests
    slept = _admin(base_url, "sleep", level=2).json()
    assert worker.worker_pid is None
    # this test process also holds the pytest run; the worker's share is what sleep frees
    assert slept["resident_bytes_before"] - slept["resident_bytes"] > 300 * 2**20
    assert worker.stats().asleep and worker.stats().requests == served_before
    assert _ask(base_url).status_code == 503
    state = httpx.get(f"{base_url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
    assert state.json()["level"] == 2
    woke = _admin(base_url, "wake").json()
    assert woke["state"] == "awake" and woke["seconds"] > 0
    assert _ask(base_url).json()["choices"][0]["message"]["content"] == want


def test_unknown_names_fail_before_a_worker_starts():
    with pytest.raises(ConfigError, match="smollm2-135m"):
        WorkerEngine(EngineConfig(model="no-such-model"))
    with pytest.raises(UnknownNameError, match="transformers"):
        WorkerEngine(EngineConfig(engine="nope"))


def test_the_http_side_imports_no_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import argosy.serving.api, argosy.serving.worker, argosy.cli.serve\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("value", ["0.0005", "1e-4"])
def test_the_switch_interval_knob_sets_the_interpreter_hand_off(monkeypatch, value):
    import sys

    from argosy.serving import worker

    monkeypatch.setenv(worker.SWITCH_INTERVAL_ENV, value)
    before = sys.getswitchinterval()
    try:
        worker._set_switch_interval()
        assert sys.getswitchinterval() == pytest.approx(float(value))
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("value", ["fast", "0", "2"])
def test_a_bad_switch_interval_is_refused_naming_the_variable(monkeypatch, value):
    from argosy.serving import worker

    monkeypatch.setenv(worker.SWITCH_INTERVAL_ENV, value)
    with pytest.raises(ValueError, match=worker.SWITCH_INTERVAL_ENV):
        worker._set_switch_interval()
