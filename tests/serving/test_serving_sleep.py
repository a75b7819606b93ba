"""Sleep and wake of a real worker forked from a real node zygote, with the shipped model.

Level 2 ends the worker (it gives back what the worker held) and wake forks a new one from
the zygote; level 1 unmaps the weights in a worker that stays. Both wake to the same greedy
tokens; requests while asleep get 503; sleep and wake are idempotent; a stream running
when sleep comes ends (finished within the drain time, else cancelled with the asleep error).
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from http_helpers import served
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.serving import EngineConfig, GenerationRequest, SamplingParams
from argosy.serving.api import build_app
from argosy.serving.errors import EngineAsleepError
from argosy.serving.memory import read_process_memory
from argosy.serving.worker import WorkerEngine
from argosy.serving.zygote import ZygoteUnavailableError, fork_worker

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
TOKEN = "t0ken"
MIB = 2**20


@pytest.fixture(scope="module")
def zygote_socket(tmp_path_factory):
    path = tmp_path_factory.mktemp("zygote") / "z.sock"
    cmd = [sys.executable, "-m", "argosy", "zygote", "--socket", str(path)]
    proc = subprocess.Popen([*cmd, "--warm-model", MODEL], stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert path.exists(), "argosy zygote did not start"
    yield path
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert not path.exists()


@pytest.fixture(scope="module")
def worker(zygote_socket):
    config = EngineConfig(model=MODEL, speculative="off", num_threads=1)
    engine = WorkerEngine(config, drain_timeout_s=0.5, zygote_socket=zygote_socket)
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def base_url(worker):
    with served(build_app(worker, MODEL, admin_token=TOKEN)) as url:
        yield url


def _admin(base_url, path, **body):
    headers = {"authorization": f"Bearer {TOKEN}"}
    if path == "state":
        return httpx.get(f"{base_url}/admin/state", headers=headers, timeout=60).json()
    return httpx.post(f"{base_url}/admin/{path}", json=body, headers=headers, timeout=300).json()


def _greedy_tokens(worker, text="Name three colours.", max_tokens=8):
    ids = worker.encode_chat([{"role": "user", "content": text}])
    request = GenerationRequest(tuple(ids), SamplingParams(max_tokens=max_tokens))
    return worker.generate(request).token_ids


def _parent_pid(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_the_worker_is_a_fork_of_the_zygote(worker, base_url):
    state = _admin(base_url, "state")
    assert state["worker_start"] == "zygote"
    pids = state["pids"]
    assert pids["http"] == os.getpid() and pids["worker"] == worker.worker_pid
    assert _parent_pid(pids["worker"]) == pids["zygote"]
    worker_memory = state["memory"]["worker"]
    assert worker_memory["file_bytes"] > 400 * MIB  # the memory-mapped weights, warmed up
    assert worker_memory["uss_bytes"] <= worker_memory["rss_bytes"]


def test_level_2_ends_the_worker_and_wakes_from_the_zygote_to_the_same_tokens(worker, base_url):
    want = _greedy_tokens(worker)
    old_pid = worker.worker_pid
    awake = read_process_memory(old_pid)
    slept = _admin(base_url, "sleep", level=2)
    assert slept["state"] == "asleep" and slept["level"] == 2
    assert slept["memory"]["worker"] is None and read_process_memory(old_pid) is None
    freed = slept["resident_bytes_before"] - slept["resident_bytes"]
    assert freed >= 0.9 * awake.rss_bytes  # all the worker held (the HTTP side is pytest here)
    assert slept["memory"]["zygote"] is not None  # the node's zygote stays for the next fork
    woke = _admin(base_url, "wake")
    assert woke["state"] == "awake" and woke["worker_start"] == "zygote"
    assert 0 < woke["seconds"] < 120
    assert worker.worker_pid not in (None, old_pid)
    assert _greedy_tokens(worker) == want


def test_level_1_unmaps_the_weights_and_wakes_to_the_same_tokens(worker, base_url):
    want = _greedy_tokens(worker)
    pid = worker.worker_pid
    awake = read_process_memory(pid)
    slept = _admin(base_url, "sleep", level=1)
    asleep = read_process_memory(pid)
    assert slept["level"] == 1 and worker.worker_pid == pid
    assert awake.file_bytes - asleep.file_bytes > 400 * MIB  # the 517 MiB of fp32 weights
    assert asleep.rss_bytes < 0.6 * awake.rss_bytes  # measured: 0.37 (the runtime stays)
    _admin(base_url, "wake")
    assert _greedy_tokens(worker) == want


def test_requests_while_asleep_get_503_and_sleep_and_wake_are_idempotent(worker, base_url):
    first = _admin(base_url, "sleep", level=2)
    again = _admin(base_url, "sleep", level=1)  # asleep already: nothing changes
    assert (again["state"], again["level"]) == ("asleep", 2) and first["level"] == 2
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    refused = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 503 and "asleep" in refused.json()["error"]["message"]
    health = httpx.get(f"{base_url}/health", timeout=60)
    assert health.status_code == 503 and health.json()["status"] == "asleep"
    assert httpx.get(f"{base_url}/live", timeout=60).status_code == 200
    streamed = httpx.post(
        f"{base_url}/v1/chat/completions", json={**body, "stream": True}, timeout=60
    )
    assert streamed.status_code == 503 and "retry-after" in streamed.headers
    _admin(base_url, "wake")
    pid = worker.worker_pid
    woke_again = _admin(base_url, "wake")  # awake already: the same worker goes on
    assert woke_again["state"] == "awake" and worker.worker_pid == pid
    assert httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120).status_code == 200


def test_sleep_during_a_stream_cancels_it_after_the_drain_time(worker):
    ids = worker.encode_chat([{"role": "user", "content": "Count from 1 to 1000 with commas."}])
    request = GenerationRequest(tuple(ids), SamplingParams(max_tokens=300))
    got: list[int] = []
    outcome: list[BaseException | str] = []
    first = threading.Event()

    def consume() -> None:
        try:
            for chunk in worker.stream(request):
                got.extend(chunk.token_ids)
                first.set()
            outcome.append("finished")
        except EngineAsleepError as err:
            outcome.append(err)
        first.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert first.wait(timeout=120)
    worker.sleep(1)  # drain_timeout_s is 0.5: 300 tokens cannot finish in time
    consumer.join(timeout=60)
    assert not consumer.is_alive(), "the stream hung after sleep"
    assert isinstance(outcome[0], EngineAsleepError) and 0 < len(got) < 300
    worker.wake()


def test_sleep_drains_a_short_stream_that_fits_the_drain_time(worker):
    ids = worker.encode_chat([{"role": "user", "content": "Count from 1 to 1000 with commas."}])
    stream = worker.stream(GenerationRequest(tuple(ids), SamplingParams(max_tokens=6)))
    got = list(next(stream).token_ids)
    worker.drain_timeout_s = 120.0
    sleeper = threading.Thread(target=worker.sleep, args=(2,))
    sleeper.start()  # waits for the stream below to finish
    finish = None
    for chunk in stream:
        got.extend(chunk.token_ids)
        finish = chunk.finish_reason or finish
    sleeper.join(timeout=60)  # well before the 120 s drain timeout: it ends with the stream
    assert not sleeper.is_alive(), "sleep waited out the drain timeout after the stream ended"
    worker.drain_timeout_s = 0.5
    assert (len(got), finish) == (6, "length") and worker.sleep_level == 2
    worker.wake()


def test_a_zygote_warms_a_tokenizer_once_and_refuses_an_unknown_model(tmp_path):
    from argosy.serving.models import resolve
    from argosy.serving.transformers_engine import load_tokenizer
    from argosy.serving.zygote import ZygoteServer

    server = ZygoteServer(tmp_path / "z.sock", target=lambda conn, config: None, preload=())
    server.warm_models = (MODEL,)
    server._warm_tokenizers()
    tokenizer = load_tokenizer(resolve(MODEL, None))
    assert load_tokenizer(resolve(MODEL, None)) is tokenizer  # a fork inherits this one
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True)
    done = subprocess.run(
        [sys.executable, "-m", "argosy", "zygote", "--socket", str(tmp_path / "y.sock")]
        + ["--warm-model", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "smollm2-135m" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_zygote_is_a_clear_error(tmp_path, zygote_socket):
    left, right = socket.socketpair()
    with left, right:
        with pytest.raises(ZygoteUnavailableError, match="no zygote answers"):
            fork_worker(Path(tmp_path) / "none.sock", right.fileno(), {})
        with socket.socket(socket.AF_UNIX) as raw:  # a request without a descriptor
            raw.connect(str(zygote_socket))
            raw.sendall(b'{"config": {}}\n')
            assert b"want one file descriptor" in raw.recv(4096)


def test_a_service_whose_zygote_is_gone_spawns_its_worker(tmp_path, caplog):
    config = EngineConfig(model=MODEL, speculative="off", num_threads=1)
    engine = WorkerEngine(config, zygote_socket=tmp_path / "gone.sock")
    with caplog.at_level(logging.WARNING, logger="argosy.serving.worker"):
        engine.load()
    try:
        assert (engine.worker_start, engine.zygote_pid) == ("spawn", None)
        assert _parent_pid(engine.worker_pid) == os.getpid()
        assert "no zygote answers" in caplog.text and "spawn" in caplog.text
    finally:
        engine.close()


OPERATIONS = st.lists(st.sampled_from(["sleep 1", "sleep 2", "wake", "ask"]), max_size=6)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations=OPERATIONS)
def test_any_sleep_and_wake_sequence_keeps_state_memory_and_answers_consistent(worker, operations):
    want = _greedy_tokens(worker, max_tokens=2)
    for operation in operations:
        level_before = worker.sleep_level
        if operation.startswith("sleep"):
            worker.sleep(int(operation[-1]))
            assert worker.sleep_level == (level_before or int(operation[-1]))
        elif operation == "wake":
            worker.wake()
            assert worker.sleep_level == 0
        elif level_before:
            with pytest.raises(EngineAsleepError):
                _greedy_tokens(worker, max_tokens=2)
        else:
            assert _greedy_tokens(worker, max_tokens=2) == want
        _check_memory_matches_the_level(worker)
    worker.wake()


def _check_memory_matches_the_level(worker):
    memory = worker.memory()
    if worker.sleep_level == 2:
        assert worker.worker_pid is None and memory["worker"] is None
    elif worker.sleep_level == 1:
        assert memory["worker"].file_bytes < 200 * MIB  # weights unmapped
    else:
        assert memory["worker"].file_bytes > 400 * MIB  # weights mapped and warmed up
