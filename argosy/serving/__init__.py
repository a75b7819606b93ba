"""Inference serving: engines behind one interface, lossless speculative decoding.

The acceleration layer for inference. It knows nothing about HTTP (that is `server`/`cli`):
an engine turns a `GenerationRequest` into tokens, and speculative proposers, looked up by
name, draft tokens that the engine verifies in one forward pass. Heavy libraries (torch,
transformers) are imported only when an engine loads.

    from argosy.serving import ENGINES, EngineConfig
    engine = ENGINES.get("transformers")(EngineConfig(model="smollm2-135m"))
    engine.load()
    print(engine.generate(engine.encode_request("The capital of France is")).text)
"""

from argosy.serving.config import EngineConfig
from argosy.serving.engine import ENGINES, Engine
from argosy.serving.speculative import PROPOSERS
from argosy.serving.types import (
    EngineStats,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)

__all__ = [
    "ENGINES",
    "PROPOSERS",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
]
