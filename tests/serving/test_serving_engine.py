"""The transformers engine on the shipped SmolLM2-135M: answers, lossless speculation,
sleep/wake and clear errors."""

import pytest

from argosy.core.errors import ConfigError, UnknownNameError
from argosy.serving import ENGINES, EngineConfig, GenerationRequest, SamplingParams

pytestmark = pytest.mark.slow

COPY_PROMPTS = [
    "Repeat exactly: The river flows past the old mill, under the stone bridge, to the sea.",
    "Copy this list: apples, pears, plums, cherries, apples, pears, plums, cherries.",
    "def add(a, b):\n    return a + b\n\nRewrite the function above, unchanged:",
]


def _greedy(engine, messages_text, spec, max_tokens=24):
    ids = engine.encode_chat([{"role": "user", "content": messages_text}])
    params = SamplingParams(max_tokens=max_tokens)
    return engine.generate(GenerationRequest(tuple(ids), params, speculative=spec))


def test_chat_answers_from_the_shipped_model(smol_engine):
    result = _greedy(smol_engine, "What is the capital of France?", "off", max_tokens=12)
    assert "Paris" in result.text
    assert result.finish_reason in {"stop", "length"}


def test_speculation_on_the_real_model_is_lossless_and_accepts_drafts(smol_engine):
    accepted = 0
    for prompt in COPY_PROMPTS:
        want = _greedy(smol_engine, prompt, "off")
        for spec in ("ngram", "auto"):
            got = _greedy(smol_engine, prompt, spec)
            assert got.token_ids == want.token_ids, (prompt, spec)
            accepted += got.spec.accepted
    assert accepted > 0


def test_sleep_releases_the_weights_and_wake_restores_them(smol_engine):
    want = _greedy(smol_engine, "Say hello.", "off", max_tokens=6)
    smol_engine.sleep()
    assert smol_engine.stats().asleep
    with pytest.raises(RuntimeError, match="asleep"):
        _greedy(smol_engine, "Say hello.", "off", max_tokens=6)
    smol_engine.wake()
    assert smol_engine.stats().last_wake_s is not None
    assert _greedy(smol_engine, "Say hello.", "off", max_tokens=6).token_ids == want.token_ids


def test_oversized_prompt_and_unknown_names_are_clear_errors(smol_engine):
    ids = tuple(range(1, 600))
    with pytest.raises(ValueError, match="exceeds the context of 512"):
        smol_engine.generate(GenerationRequest(ids, SamplingParams(max_tokens=8)))
    with pytest.raises(ConfigError, match="smollm2-135m"):
        ENGINES.get("transformers")(EngineConfig(model="no-such-model"))
    with pytest.raises(UnknownNameError, match="speculative proposer"):
        ENGINES.get("transformers")(EngineConfig(speculative="eagle9"))


def test_the_cost_model_reads_full_drafts_of_the_configured_length():
    """The draft-token cost is read from full drafts: of `num_speculative_tokens`, not of
    the cost model's default."""
    from argosy.serving import ENGINES, EngineConfig

    for k in (4, 12):
        engine = ENGINES.get("transformers")(EngineConfig(num_speculative_tokens=k))
        assert engine._costs.max_draft_tokens == k
