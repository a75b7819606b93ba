"""The engine contract and the `ENGINES` registry.

An engine owns one loaded model. `stream` yields chunks as tokens are decided; `generate`
collects them. `sleep` releases the model's memory and `wake` restores it. Engines are safe
to call from several threads: each request keeps its own KV cache and forward passes are
serialized, so one slow or abandoned request does not block the others beyond one step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from argosy.plugins.registry import Registry
from argosy.serving.config import EngineConfig
from argosy.serving.types import EngineStats, GenerationChunk, GenerationRequest, GenerationResult


@runtime_checkable
class Engine(Protocol):
    """What every serving engine provides."""

    config: EngineConfig

    def load(self) -> None:
        """Load the model (idempotent)."""
        ...

    def stream(self, request: GenerationRequest) -> Iterator[GenerationChunk]:
        """Yield chunks as tokens are decided; the last chunk carries `finish_reason`."""
        ...

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run a request to completion."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Release the model's memory (level 2 may stop a worker process); `wake` restores it."""
        ...

    def wake(self) -> None:
        """Restore the model after `sleep`."""
        ...

    def stats(self) -> EngineStats:
        """Counters since load."""
        ...


@runtime_checkable
class Tokenizes(Protocol):
    """Optional ability: text and chat messages to token ids."""

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text."""
        ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a chat, with the model's template and the generation prompt."""
        ...


EngineFactory = Callable[[EngineConfig], Engine]

ENGINES: Registry[EngineFactory] = Registry("serving engine")
ENGINES.register(
    "transformers", "argosy.serving.transformers_engine:TransformersEngine", aliases=("hf",)
)
ENGINES.register("vllm", "argosy.serving.vllm_engine:VllmEngine")
