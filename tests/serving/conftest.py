"""Shared serving fixtures: one SmolLM2-135M engine per test module (converted once, then
cached on disk), and a tiny random Llama (vocabulary TINY_VOCAB) for the decoding tests."""

import pytest
import torch
from tiny_llama import tiny_llama

from argosy.serving import ENGINES, EngineConfig

TINY_VOCAB = 48


def make_engine(speculative: str = "auto", max_context_tokens: int = 0):
    """A loaded transformers engine on one thread."""
    torch.set_num_threads(1)
    config = EngineConfig(
        model="smollm2-135m",
        speculative=speculative,
        num_threads=1,
        max_context_tokens=max_context_tokens,
    )
    engine = ENGINES.get("transformers")(config)
    engine.load()
    return engine


@pytest.fixture(scope="module")
def smol_engine():
    return make_engine(max_context_tokens=512)


@pytest.fixture(scope="module")
def tiny_model():
    torch.set_num_threads(1)
    return tiny_llama(TINY_VOCAB)
