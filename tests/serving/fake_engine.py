"""A stand-in engine for the HTTP layer's tests: no model; its streams and its tokenizer
can be held on a gate, so a test can fill every thread a real load would hold."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from argosy.serving.errors import EngineAsleepError
from argosy.serving.types import EngineStats, GenerationChunk, GenerationRequest


class FakeEngine:
    """Streams `first`, then waits on `gate`, then `last` (or the asleep error if `cut`)."""

    max_context_tokens = 1024
    vocab_size = 100

    def __init__(self, hold_streams: bool = True, hold_tokenizer: bool = False) -> None:
        self.gate = threading.Event()
        self.tokenizer_gate = threading.Event()
        self.hold_streams, self.hold_tokenizer = hold_streams, hold_tokenizer
        self.asleep = False
        self.cut = False
        self.fault: BaseException | None = None
        """Raised after the first chunk, when set."""
        self.encoded = 0
        self.started = 0
        self.requests: list[GenerationRequest] = []
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        with self._lock:
            self.encoded += 1
        if self.hold_tokenizer:
            self.tokenizer_gate.wait(60)
        return [3 + (ord(c) % 90) for c in text[:50]] or [3]

    def encode_chat(self, messages: Sequence[dict[str, Any]], tools: Any = None) -> list[int]:
        return self.encode(" ".join(str(m.get("content", "")) for m in messages))

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(97 + t % 26) for t in token_ids)

    def stats(self) -> EngineStats:
        return EngineStats(asleep=self.asleep, running=self.started)

    def stream(self, request: GenerationRequest) -> Iterator[GenerationChunk]:
        if self.asleep:
            raise EngineAsleepError("the engine is asleep; POST /admin/wake first")
        with self._lock:
            self.started += 1
            self.requests.append(request)
        yield GenerationChunk((5,), "a")
        if self.hold_streams:
            self.gate.wait(60)
        if self.cut:
            raise EngineAsleepError("request cancelled: the engine went to sleep")
        if self.fault is not None:
            raise self.fault
        yield GenerationChunk((6,), "b", "stop")
