"""The `transformers` engine: an HF causal LM on CPU or one CUDA device, embedded in-process.

`config.device` and `config.dtype` are resolved once at load (`placement.resolve`: auto is
the first CUDA device in the checkpoint's 16-bit dtype, bfloat16 for a float32 checkpoint,
else the CPU in float32); the weights, every KV cache, the batch's inputs and the draft
models live there, and a greedy request's tokens equal `generate()`'s in that dtype there.

Each request decodes with its own DynamicCache through `decoding.Decoder`; concurrent
requests are continuously batched by `batching.BatchLoop` (admitted between decode steps,
one batched forward pass per step verifying every request's draft). With a memory fraction
the engine sizes its KV capacity from what the budget leaves after the weights
(`budget.MemoryBudget`), refuses to load when the weights alone do not fit, and the batch
loop admits requests only while their KV fits (the rest wait). Prompts are prefilled in
chunks between decode steps, on top of the longest prefix the prefix cache holds
(`prefill.py`, `prefix_cache.py`; its size comes out of the KV budget). `sleep` drops
the weights and the prefix cache and returns freed pages to the OS; `wake` reloads the
weights from the converted checkpoint (memory-mapped safetensors), which takes a
fraction of a second for 135M.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from argosy.hardware.backends import cuda
from argosy.serving import models, placement
from argosy.serving.batching import BatchLoop
from argosy.serving.budget import (
    MemoryBudget,
    host_memory_bytes,
    kv_bytes_per_token,
    weights_bytes,
)
from argosy.serving.config import EngineConfig
from argosy.serving.decoding import Decoder
from argosy.serving.detokenize import TextStream
from argosy.serving.errors import EngineAsleepError
from argosy.serving.placement import Placement
from argosy.serving.prefill import ChunkSizer
from argosy.serving.prefix_cache import PrefixCache
from argosy.serving.speculative import PROPOSERS, check_spec, split_spec
from argosy.serving.speculative.base import OFF, Proposer, ProposerContext
from argosy.serving.speculative.costs import AcceptanceTracker, StepCosts
from argosy.serving.types import (
    EngineStats,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    TokenLogprob,
)

_MAX_SAMPLES = 4096


class TransformersEngine:
    """Serves one HF checkpoint with `transformers`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.path = models.resolve(config.model, config.cache_dir)
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._stats = EngineStats()
        self._costs = StepCosts(max_draft_tokens=config.num_speculative_tokens)
        self._acceptance = AcceptanceTracker()
        self._loop: BatchLoop | None = None
        self._prefix_cache: PrefixCache | None = None
        self.budget: MemoryBudget | None = None
        self.placement: Placement | None = None
        """Where and in which dtype the weights live; resolved by `load`."""
        check_spec(config.speculative)  # unknown names, a missing draft: at construction

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        """Load tokenizer and weights (idempotent)."""
        import torch
        from transformers import AutoModelForCausalLM

        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        where = self._place()
        if self.config.memory_fraction is not None and self.budget is None:
            self.budget = self._budget(where)  # refuses before the weights are read
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.path)
            if self._model is None:
                model = AutoModelForCausalLM.from_pretrained(self.path, dtype=where.torch_dtype())
                self._model = model.to(where.device).eval()
                _warm_up_model(self._model)
                self._proposer(None)  # its own proposer (a draft, a depth) fails the load,
                # not every request after a ready
            self._stats.asleep = False
            if self._loop is None:
                self._loop = self._make_loop()

    def _make_loop(self) -> BatchLoop:
        """The batch loop, its prefix cache (at most a quarter of a KV budget, which then
        admits requests against the rest) and its prefill chunking."""
        config = self.config
        capacity = self.budget.kv_capacity_tokens if self.budget else 0
        cached = min(config.prefix_cache_tokens, capacity // 4 if capacity else 1 << 62)
        if cached >= config.prefix_block_tokens:
            self._prefix_cache = PrefixCache(config.prefix_block_tokens, cached)
            capacity -= cached if capacity else 0
        chunk, ratio = config.prefill_chunk_tokens, config.prefill_stall_ratio
        return BatchLoop(
            self._batched_forward,
            _make_cache,
            config.max_batch_size,
            kv_capacity_tokens=capacity,
            max_draft_tokens=config.num_speculative_tokens,
            prefix_cache=self._prefix_cache,
            chunks=ChunkSizer(chunk, ratio) if chunk else None,
        )

    def _place(self) -> Placement:
        """Resolve `config.device` and `config.dtype` against this host (once)."""
        if self.placement is None:
            device = placement.resolve_device(self.config.device, cuda.visible_count())
            where = Placement(device, "float32")
            bf16 = not where.is_cuda or cuda.bf16_supported(where.index)
            checkpoint = placement.checkpoint_dtype(self.path)
            dtype = placement.resolve_dtype(self.config.dtype, device, checkpoint, bf16)
            self.placement = Placement(device, dtype)
            if self.placement.is_cuda:
                cuda.use_device(self.placement.index)
        return self.placement

    def _budget(self, where: Placement) -> MemoryBudget:
        """The service's share of its device, checked against the weights in their dtype."""
        fraction = self.config.memory_fraction
        assert fraction is not None
        _limit_accelerator(fraction, where)
        budget = MemoryBudget(
            fraction=fraction,
            device_bytes=self.config.device_memory_bytes or device_memory_bytes(where),
            weights_bytes=weights_bytes(self.path, where.dtype_bytes),
            kv_bytes_per_token=kv_bytes_per_token(self.path, where.dtype_bytes),
        )
        budget.check()
        return budget

    def sleep(self, level: int = 1) -> None:
        """Drop the weights (unmapping the checkpoint) and hand freed heap pages back to the
        OS; KV caches leave with their requests (every level: in-process)."""
        with self._lock:
            self._model = None
            self._stats.asleep = True
        if self._prefix_cache is not None:
            self._prefix_cache.clear()
        gc.collect()
        _trim_heap()
        if self.placement is not None and self.placement.is_cuda:
            cuda.release_cached()

    def wake(self) -> None:
        """Map the weights again after `sleep` and warm them up, timing it."""
        start = time.perf_counter()
        self.load()
        self._stats.last_wake_s = time.perf_counter() - start

    def stats(self) -> EngineStats:
        """Counters since load, with the batch loop's running and waiting requests."""
        if self._loop is not None:
            self._stats.running = self._loop.running
            self._stats.batched_steps = self._loop.batch_steps
            self._stats.batched_tokens = self._loop.batched_tokens
            self._stats.waiting = self._loop.queued
            self._stats.kv_reserved_tokens = self._loop.kv_reserved_tokens
            self._stats.prefill_chunks = self._loop.prefill_chunks
        if self._prefix_cache is not None:
            cache = self._prefix_cache
            self._stats.prefix_cache = cache.stats.as_dict() | {
                "cached_tokens": cache.cached_tokens,
                "capacity_tokens": cache.capacity_tokens,
            }
        if self.budget is not None:
            self._stats.budget = dict(self.budget.as_dict())
        return self._stats

    # -- tokenization ------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens added)."""
        return list(self._tok().encode(text, add_special_tokens=False))

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat rendered with the model's template (`tools` go to the
        template, which may show them to the model or not)."""
        ids = self._tok().apply_chat_template(
            list(messages),
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return list(ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids."""
        return str(self._tok().decode(list(token_ids), skip_special_tokens=True))

    @property
    def max_context_tokens(self) -> int:
        """Prompt plus completion limit."""
        if self.config.max_context_tokens:
            return self.config.max_context_tokens
        return int(self._require_model().config.max_position_embeddings)

    @property
    def vocab_size(self) -> int:
        """Token ids are in [0, vocab_size)."""
        return int(self._require_model().get_input_embeddings().num_embeddings)

    @property
    def eos_ids(self) -> frozenset[int]:
        """Token ids that end a generation."""
        ids = {self._tok().eos_token_id}
        conf = self._require_model().generation_config.eos_token_id
        ids |= set(conf) if isinstance(conf, list) else {conf}
        return frozenset(i for i in ids if i is not None)

    # -- generation --------------------------------------------------------------------
    def stream(self, request: GenerationRequest) -> Iterator[GenerationChunk]:
        """Yield chunks as tokens are decided; text deltas never split a character."""
        decoder = self._decoder(request)
        yield from self._run(self._submit(decoder), decoder, request)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run to completion and return text, tokens, timings and speculation counters."""
        start = time.perf_counter()
        ttft: float | None = None
        ids: list[int] = []
        finish = "length"
        decoder = self._decoder(request)
        for chunk in self._run(self._submit(decoder), decoder, request):
            ttft = ttft if ttft is not None else time.perf_counter() - start
            ids.extend(chunk.token_ids)
            finish = chunk.finish_reason or finish
        return GenerationResult(
            text=self.decode(ids),
            token_ids=tuple(ids),
            prompt_tokens=len(request.prompt_ids),
            finish_reason=finish,
            ttft_s=ttft or 0.0,
            total_s=time.perf_counter() - start,
            spec=decoder.counters,
        )

    def _decoder(self, request: GenerationRequest) -> Decoder:
        from transformers import DynamicCache

        self._check_length(request)
        key, proposer = self._proposer(request.speculative)
        cache = DynamicCache()
        return Decoder(
            self._forward,
            _crop,
            cache,
            request.prompt_ids,
            request.params,
            self.eos_ids,
            proposer,
            self._costs,
            self._acceptance,
            key,
        )

    def _submit(self, decoder: Decoder) -> Iterator[tuple[list[int], str | None]]:
        if self._loop is None:
            raise EngineAsleepError("engine not loaded: call load()")
        return self._loop.submit(decoder).chunks()

    def _run(
        self,
        steps: Iterator[tuple[list[int], str | None]],
        decoder: Decoder,
        request: GenerationRequest,
    ) -> Iterator[GenerationChunk]:
        start = last = time.perf_counter()
        text = TextStream(self.decode)
        ids = text.ids
        try:
            for new, finish in steps:
                now = time.perf_counter()
                self._sample_time(now - start if not ids else None, now - last, len(new))
                last = now
                logprobs = self._token_logprobs(decoder.logprobs[len(ids) : len(ids) + len(new)])
                delta = text.push(new, final=finish is not None)
                yield GenerationChunk(tuple(new), delta, finish, logprobs)
        finally:
            getattr(steps, "close", lambda: None)()
            self._finish(request, decoder, len(ids))

    def _token_logprobs(
        self, entries: Sequence[tuple[int, float, tuple[tuple[int, float], ...]]]
    ) -> tuple[TokenLogprob, ...]:
        """The decoder's (token, log-probability, alternatives) with each token's text."""
        out = []
        for token, logprob, top in entries:
            text, raw = self._token_text(token)
            alts = tuple((self._token_text(t)[0], lp) for t, lp in top)
            out.append(TokenLogprob(token, logprob, alts, text, raw))
        return tuple(out)

    def _token_text(self, token: int) -> tuple[str, bytes]:
        """A token's exact bytes (byte-level BPE pieces mapped back to bytes) and their text."""
        piece = self._tok().convert_ids_to_tokens(token)
        decoder = _byte_decoder()
        if isinstance(piece, str) and piece and all(c in decoder for c in piece):
            raw = bytes(decoder[c] for c in piece)
        else:
            raw = self.decode([token]).encode()
        return raw.decode("utf-8", errors="replace"), raw

    # -- internals ---------------------------------------------------------------------
    def _finish(self, request: GenerationRequest, decoder: Decoder, num_tokens: int) -> None:
        with self._lock:
            self._stats.requests += 1
            self._stats.prompt_tokens += len(request.prompt_ids)
            self._stats.completion_tokens += num_tokens
            self._stats.spec.add(decoder.counters)

    def _sample_time(self, ttft_s: float | None, step_s: float, num_tokens: int) -> None:
        if ttft_s is not None:
            _push(self._stats.ttft_s, ttft_s)
        elif num_tokens:
            _push(self._stats.tpot_s, step_s / num_tokens)

    def _forward(self, token_ids: Sequence[int], cache: Any, num_logits: int) -> Any:
        import torch

        with self._lock, torch.inference_mode():
            model = self._require_model()
            ids = torch.tensor([list(token_ids)], dtype=torch.long, device=model.device)
            out = model(
                input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=num_logits
            )
            return out.logits[0]

    def _batched_forward(
        self, ids: Any, cache: Any, attention_mask: Any, position_ids: Any, num_logits: int
    ) -> Any:
        import torch

        with self._lock, torch.inference_mode():
            model = self._require_model()
            device = model.device
            out = model(
                input_ids=ids.to(device, non_blocking=True),
                attention_mask=attention_mask.to(device, non_blocking=True),
                position_ids=position_ids.to(device, non_blocking=True),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=num_logits,
            )
            return out.logits

    def _proposer(self, spec: str | None) -> tuple[str, Proposer | None]:
        """The request's proposer and the key its acceptance is tracked under (its spec),
        started from the engine's running acceptance of that proposer."""
        name, arg = split_spec(spec or self.config.speculative)
        if name == OFF:
            return "", None
        key = f"{PROPOSERS.canonical(name)}:{arg or ''}"
        context = ProposerContext(
            target=self._require_model(), arg=arg, acceptance=self._acceptance.acceptance(key)
        )
        factory = PROPOSERS.get(name)
        return key, factory(max_draft_tokens=self.config.num_speculative_tokens, context=context)

    def _check_length(self, request: GenerationRequest) -> None:
        total = len(request.prompt_ids) + request.params.max_tokens
        if not request.prompt_ids:
            raise ValueError("prompt is empty")
        if total > self.max_context_tokens:
            raise ValueError(
                f"prompt ({len(request.prompt_ids)} tokens) plus max_tokens "
                f"({request.params.max_tokens}) exceeds the context of {self.max_context_tokens}"
            )
        capacity = self._loop.kv_capacity_tokens if self._loop else 0
        if capacity and total + self.config.num_speculative_tokens > capacity:
            raise ValueError(
                f"prompt ({len(request.prompt_ids)} tokens) plus max_tokens "
                f"({request.params.max_tokens}) and a draft ({self.config.num_speculative_tokens})"
                f" exceed this service's KV budget of {capacity} tokens (memory_fraction "
                f"{self.config.memory_fraction:g})"
            )

    def _require_model(self) -> Any:
        if self._model is None:
            raise EngineAsleepError("engine is asleep or not loaded: call wake() or load()")
        return self._model

    def _tok(self) -> Any:
        if self._tokenizer is None:
            raise RuntimeError("engine not loaded: call load()")
        return self._tokenizer


def _limit_accelerator(fraction: float, where: Placement) -> None:
    """Cap this process's share of its CUDA device's memory at `fraction` (the caching
    allocator refuses beyond it); nothing for an engine on the CPU."""
    if where.is_cuda:
        cuda.limit_process_memory(fraction, where.index)


def device_memory_bytes(where: Placement) -> int:
    """The memory of the engine's device: the GPU's total, or the host's MemTotal."""
    return cuda.total_memory(where.index) if where.is_cuda else host_memory_bytes()


def _warm_up_model(model: Any) -> None:
    """One 1-token forward pass right after loading: it faults the memory-mapped weights in
    (the LM head reads them all) and sets up the kernels, so that cost is paid by load or
    wake rather than by the first request (about 0.2 s for 135M on an idle core)."""
    import torch

    ids = torch.zeros((1, 1), dtype=torch.long, device=model.device)
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)


_TOKENIZERS: dict[str, Any] = {}
_TOKENIZERS_LOCK = threading.Lock()


def load_tokenizer(path: Any) -> Any:
    """The checkpoint's tokenizer with its chat template compiled, loaded once per process:
    a zygote that warmed it (`argosy zygote --warm-model`) hands it to every worker it forks,
    which then skips about 0.2 s of CPU at load and at a level-2 wake."""
    from transformers import AutoTokenizer

    with _TOKENIZERS_LOCK:
        key = str(path)
        if key not in _TOKENIZERS:
            tokenizer = AutoTokenizer.from_pretrained(path)
            _warm_up_template(tokenizer)
            _TOKENIZERS[key] = tokenizer
        return _TOKENIZERS[key]


def _warm_up_template(tokenizer: Any) -> None:
    """Compile the chat template once (transformers caches the compiled template)."""
    if getattr(tokenizer, "chat_template", None):
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte-to-character table (GPT-2's `bytes_to_unicode`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _make_cache(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=layers)


def _crop(cache: Any, num_tokens: int) -> None:
    if num_tokens > 0:
        cache.crop(-num_tokens)  # transformers takes a negative count to remove


def _push(samples: list[float], value: float) -> None:
    samples.append(value)
    if len(samples) > _MAX_SAMPLES:
        del samples[: len(samples) - _MAX_SAMPLES]


def _trim_heap() -> None:
    """Ask glibc to return freed heap pages to the OS (no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return
