"""An engine in its own worker process, so that sleeping can give back nearly all memory.

`WorkerEngine` has the `Engine` interface and forwards every call over a pipe to a child
process (multiprocessing, spawn) that holds the real engine, looked up by name in `ENGINES`.
The serving process itself stays small: it never imports torch or transformers.

The worker starts either as a fresh Python (multiprocessing spawn: imports torch and
transformers, 7-10 s on two idle cores) or, given `zygote_socket`, as a fork of the node's
zygote (`zygote.py`), which has those imports done and shares them copy-on-write. If the
zygote does not answer, the worker is spawned and a warning is logged.

Sleep levels (the tidal lease drives them through `/admin/sleep`):
- level 1: the worker drops weights (a memory map of the cached checkpoint) and KV caches
  and trims its heap; the Python/torch runtime (~370 MiB for the 135M model) stays, so wake
  is a re-map plus a warm-up forward pass;
- level 2: the worker process exits; the service keeps only the HTTP process. Wake starts
  a new worker: a fork of the zygote (about a second) or a spawn (seconds to minutes).

Before sleeping, admission stops (new requests fail with `EngineAsleepError`) and requests
in flight get `drain_timeout_s` to finish; those still running are cancelled: their
streams end with `EngineAsleepError`.

Messages, parent to child: `("call", id, method, args)`, `("stream", id, request)`,
`("cancel", id, None)`, `("exit", id, None)`. Child to parent: `("ok", id, value)`,
`("chunk", id, chunk)`, `("end", id, None)`, `("err", id, (type_name, message))`.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError, ConfigError
from argosy.serving.config import EngineConfig
from argosy.serving.errors import EngineAsleepError, EngineFailedError
from argosy.serving.limits import trim_memory
from argosy.serving.memory import ProcessMemory, read_process_memory, rss_bytes
from argosy.serving.types import EngineStats, GenerationChunk, GenerationRequest, GenerationResult
from argosy.serving.zygote import ForkedWorker, ZygoteUnavailableError, fork_worker

log = logging.getLogger(__name__)

_READY_ID = 0
_CANCELLED = "request cancelled: the engine went to sleep before it finished"
_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "ConfigError": ConfigError,
    "UnknownNameError": ConfigError,
    "ShareError": ConfigError,
    "PlacementError": ConfigError,
    "EngineAsleepError": EngineAsleepError,
}


class WorkerEngine:
    """Forwards the `Engine` interface to a child process that holds the real engine."""

    def __init__(
        self,
        config: EngineConfig,
        drain_timeout_s: float = 10.0,
        zygote_socket: Path | None = None,
    ) -> None:
        from argosy.serving.engine import ENGINES
        from argosy.serving.models import resolve_name_only

        ENGINES.canonical(config.engine)  # unknown engines fail here, listing known ones
        resolve_name_only(config.model)  # unknown models too, before a process starts
        self.config = config
        self.drain_timeout_s = drain_timeout_s
        self.zygote_socket = zygote_socket
        self.worker_start = "none"
        """How the current worker started: `zygote` (a fork), `spawn`, or `none` yet."""
        self.zygote_pid: int | None = None
        """The zygote the last worker was forked from (it stays while the worker sleeps)."""
        self.sleep_level = 0
        self.last_wake_s: float | None = None
        self._proc: Any = None
        self._conn: Any = None
        self._send_lock = threading.Lock()
        self._state_lock = threading.RLock()
        self._pending: dict[int, queue.Queue[tuple[str, int, Any]]] = {}
        self._ids = itertools.count(1)
        self._flight = threading.Condition()  # guards _in_flight and _admitting
        self._in_flight = 0
        self._admitting = False
        self._info: dict[str, Any] = {}
        self._stats_before_exit = EngineStats()

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        """Start the worker and wait until its model is loaded (idempotent)."""
        with self._state_lock:
            if self._proc is None or not self._proc.is_alive():
                self._start_worker()
            self._set_admitting(True)

    def sleep(self, level: int = 2) -> None:
        """Stop admitting, drain, then drop the model (1) or stop the worker (2); sleeping
        while asleep does nothing, whatever the level."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, not {level}")
        with self._state_lock:
            if self.sleep_level:
                return
            self._set_admitting(False)
            self._drain()
            if level == 1:
                self._call("sleep")
            else:
                self._stats_before_exit = self._call("stats")
                self._stop_worker()
            self.sleep_level = level

    def wake(self) -> None:
        """Undo `sleep` and time it (`last_wake_s`); waking an awake engine does nothing."""
        with self._state_lock:
            if not self.sleep_level:
                return
            start = time.perf_counter()
            if self.sleep_level == 1:
                self._call("wake")
            else:
                self._start_worker()
            self.sleep_level = 0
            self._set_admitting(True)
            self.last_wake_s = time.perf_counter() - start

    def close(self) -> None:
        """Stop the worker process."""
        with self._state_lock:
            self._set_admitting(False)
            self._stop_worker()

    def stats(self) -> EngineStats:
        """The worker's counters (kept across a level-2 sleep)."""
        if self.sleep_level == 2 or self._conn is None:
            stats = self._stats_before_exit
        else:
            stats = self._call("stats")
        stats.asleep = bool(self.sleep_level)
        stats.last_wake_s = self.last_wake_s
        return stats

    @property
    def asleep(self) -> bool:
        """Whether new requests are refused now (asleep, going to sleep, or not loaded);
        answered here, without a call to the worker."""
        with self._flight:
            return not self._admitting

    @property
    def worker_pid(self) -> int | None:
        """Process id of the worker (None while it is stopped)."""
        return self._proc.pid if self._proc is not None else None

    def resident_bytes(self) -> int:
        """Resident memory of the service: this process plus the worker (not the zygote,
        which every service on the node shares; `memory()` reports it apart)."""
        total = rss_bytes(os.getpid())
        if self._proc is not None:
            total += rss_bytes(self._proc.pid)
        return total

    def pids(self) -> dict[str, int | None]:
        """Process ids by role: `http` (this process), `worker`, `zygote` (None if none)."""
        return {"http": os.getpid(), "worker": self.worker_pid, "zygote": self.zygote_pid}

    def memory(self) -> dict[str, ProcessMemory | None]:
        """Each role's memory (RSS split, PSS, USS); None for a process that is not there."""
        pids = self.pids().items()
        return {role: read_process_memory(pid) if pid else None for role, pid in pids}

    # -- the engine interface ----------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text."""
        return list(self._call("encode", text))

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat with the model's template (and `tools`, if any)."""
        args: tuple[Any, ...] = ([dict(m) for m in messages],)
        return list(self._call("encode_chat", *(args if tools is None else (*args, tools))))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids."""
        return str(self._call("decode", list(token_ids)))

    @property
    def vocab_size(self) -> int | None:
        """The model's vocabulary size (known from the first start; None before)."""
        value = self._info.get("vocab_size")
        return int(value) if value else None

    @property
    def max_context_tokens(self) -> int:
        """Prompt plus completion limit (known from the first start)."""
        if "max_context_tokens" not in self._info:
            raise EngineAsleepError("the engine has not been loaded yet")
        return int(self._info["max_context_tokens"])

    def stream(self, request: GenerationRequest) -> Iterator[GenerationChunk]:
        """Yield the worker's chunks; closing the iterator cancels the request there."""
        rid, replies = self._admit()
        done = False
        try:
            self._send(("stream", rid, request))
            while True:
                kind, _, payload = replies.get()
                if kind == "chunk":
                    yield payload
                    continue
                done = True
                if kind == "err":
                    raise _rebuild(payload)
                return
        finally:
            if not done:
                self._send(("cancel", rid, None), quiet=True)
            self._release(rid)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run a request to completion in the worker."""
        rid, replies = self._admit()
        try:
            self._send(("call", rid, "generate", (request,)))
            return self._await(replies)  # type: ignore[no-any-return]
        finally:
            self._release(rid)

    # -- internals ---------------------------------------------------------------------
    def _start_worker(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent_conn, child_conn = context.Pipe()
        replies: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self._pending[_READY_ID] = replies
        self._conn = parent_conn
        self._proc = self._fork_from_zygote(child_conn) or self._spawn(context, child_conn)
        child_conn.close()
        threading.Thread(target=self._read_replies, args=(parent_conn,), daemon=True).start()
        try:
            self._info = self._await(replies)
        finally:
            self._pending.pop(_READY_ID, None)

    def _fork_from_zygote(self, child_conn: Any) -> ForkedWorker | None:
        if self.zygote_socket is None:
            return None
        try:
            pid, zygote_pid = fork_worker(
                self.zygote_socket, child_conn.fileno(), self.config.model_dump()
            )
        except ZygoteUnavailableError as err:
            log.warning("%s; starting the worker by spawn (slow)", err)
            return None
        self.worker_start, self.zygote_pid = "zygote", zygote_pid
        return ForkedWorker(pid, zygote_pid)

    def _spawn(self, context: Any, child_conn: Any) -> Any:
        proc = context.Process(
            target=worker_main,
            args=(child_conn, self.config.model_dump()),
            name="argosy-serve-worker",
            daemon=True,
        )
        proc.start()
        self.worker_start, self.zygote_pid = "spawn", None
        return proc

    def _stop_worker(self) -> None:
        if self._proc is None:
            return
        self._send(("exit", 0, None), quiet=True)
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)
        self._conn.close()
        self._proc, self._conn = None, None
        self._fail_pending()

    def _drain(self) -> None:
        """Wait up to `drain_timeout_s` for requests in flight, then cancel the rest."""
        with self._flight:
            self._flight.wait_for(lambda: not self._in_flight, timeout=self.drain_timeout_s)
        for rid in list(self._pending):
            if rid != _READY_ID:
                self._send(("cancel", rid, None), quiet=True)

    def _admit(self) -> tuple[int, queue.Queue[tuple[str, int, Any]]]:
        with self._flight:
            if not self._admitting:
                raise EngineAsleepError("the engine is asleep; POST /admin/wake first")
            self._in_flight += 1
            rid = next(self._ids)
            self._pending[rid] = queue.Queue()
            return rid, self._pending[rid]

    def _release(self, rid: int) -> None:
        self._pending.pop(rid, None)
        with self._flight:  # not the state lock: sleep holds that while it drains
            self._in_flight -= 1
            self._flight.notify_all()

    def _set_admitting(self, admitting: bool) -> None:
        with self._flight:
            self._admitting = admitting

    def _call(self, method: str, *args: Any) -> Any:
        if self._conn is None:
            raise EngineAsleepError("the engine is asleep; POST /admin/wake first")
        rid = next(self._ids)
        replies: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self._pending[rid] = replies
        try:
            self._send(("call", rid, method, args))
            return self._await(replies)
        finally:
            self._pending.pop(rid, None)

    def _await(self, replies: queue.Queue[tuple[str, int, Any]]) -> Any:
        kind, _, payload = replies.get()
        if kind == "err":
            raise _rebuild(payload)
        return payload

    def _send(self, message: tuple[Any, ...], quiet: bool = False) -> None:
        try:
            with self._send_lock:
                if self._conn is None:
                    raise EngineAsleepError("the engine is asleep; POST /admin/wake first")
                self._conn.send(message)
        except (OSError, EngineAsleepError):
            if not quiet:
                raise

    def _read_replies(self, conn: Any) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            target = self._pending.get(message[1])
            if target is not None:
                target.put(message)
        with self._state_lock:  # a worker stopped on purpose was handled by _stop_worker;
            if self._conn is conn:  # a newer worker's waiters must not hear of this one
                self._fail_pending()

    def _fail_pending(self) -> None:
        gone = ("err", 0, ("EngineFailedError", "the worker process stopped"))
        for replies in list(self._pending.values()):
            replies.put(gone)


def _rebuild(payload: tuple[str, str]) -> Exception:
    name, message = payload
    if name == "EngineFailedError":
        return EngineFailedError(message)
    kind = _ERRORS.get(name)
    if kind is ConfigError:
        return ConfigError(message)
    return kind(message) if kind is not None else EngineFailedError(f"{name}: {message}")


# -- the child process -----------------------------------------------------------------
def worker_main(conn: Any, config: dict[str, Any]) -> None:
    """Entry point of the worker: load the engine, then serve messages until `exit`."""
    from argosy.serving.engine import ENGINES

    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            try:
                conn.send(message)
            except OSError:
                return  # the parent is gone or stopping us

    try:
        _set_switch_interval()
        engine = ENGINES.get(config["engine"])(EngineConfig(**config))
        engine.load()
        info = {
            "max_context_tokens": engine.max_context_tokens,
            "vocab_size": getattr(engine, "vocab_size", None),
            "pid": os.getpid(),
        }
        send(("ok", _READY_ID, info))
    except Exception as err:  # reported to the parent, which raises it
        send(("err", _READY_ID, (type(err).__name__, str(err))))
        return
    _serve_messages(conn, engine, send)


SWITCH_INTERVAL_ENV = "ARGOSY_GIL_SWITCH_S"
"""Seconds between the interpreter's forced GIL hand-offs in the worker (Python's default
is 0.005). The batch loop's thread holds the GIL while it launches a step's kernels, and
on a GPU a small model's step is launch-bound, so a request's thread may wait for a forced
hand-off before it can take its tokens: a shorter interval bounds that wait. Unset: the
default is kept (to be decided by measurement on a GPU: benchmarks/serving_gpu.py)."""


def _set_switch_interval() -> None:
    value = os.environ.get(SWITCH_INTERVAL_ENV)
    if not value:
        return
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{SWITCH_INTERVAL_ENV} must be seconds, not {value!r}") from None
    if not 1e-6 <= seconds <= 1.0:
        raise ValueError(f"{SWITCH_INTERVAL_ENV} must be in [1e-6, 1] seconds, not {value}")
    sys.setswitchinterval(seconds)


_TOKENIZE_METHODS = frozenset({"encode", "encode_chat", "decode"})
_LONG_METHODS = frozenset({"generate"})


def _serve_messages(
    conn: Any, engine: Any, send: Any, exit_process: Callable[[int], Any] = os._exit
) -> None:
    """Serve messages until `exit`. Streams (and `generate`) run on one pool, tokenizing on
    a second and every other call (`stats`, `sleep`, ...) on a third, so `/metrics` never
    waits for a thread that a stream holds, nor for a huge prompt's tokenization."""
    cancelled: set[int] = set()
    streams = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="argosy-stream")
    tokenize = ThreadPoolExecutor(max_workers=4, thread_name_prefix="argosy-tokenize")
    control = ThreadPoolExecutor(max_workers=4, thread_name_prefix="argosy-control")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        kind, rid = message[0], message[1]
        if kind == "exit":
            break
        if kind == "cancel":
            cancelled.add(rid)
        elif kind == "stream":
            streams.submit(_run_stream, engine, rid, message[2], send, cancelled)
        elif kind == "call":
            method = message[2]
            pool = (
                streams
                if method in _LONG_METHODS
                else tokenize
                if method in _TOKENIZE_METHODS
                else control
            )
            pool.submit(_run_call, engine, rid, method, message[3], send)
    exit_process(0)  # the parent drained or gave up on what runs here; nothing to flush


def _run_call(engine: Any, rid: int, method: str, args: tuple[Any, ...], send: Any) -> None:
    try:
        send(("ok", rid, getattr(engine, method)(*args)))
    except Exception as err:  # every failure goes back to the caller
        send(("err", rid, (type(err).__name__, str(err))))
    finally:
        if method in _TOKENIZE_METHODS and _big(args):
            trim_memory()  # a huge prompt's strings and ids are garbage now


_BIG_ARGS_CHARS = 2**20


def _big(args: tuple[Any, ...]) -> bool:
    """Whether a tokenizer call's arguments held about a MiB of text or more."""
    text = args[0] if args else ""
    if isinstance(text, list):
        return sum(len(str(m)) for m in text) >= _BIG_ARGS_CHARS
    return len(str(text)) >= _BIG_ARGS_CHARS


def _run_stream(
    engine: Any, rid: int, request: GenerationRequest, send: Any, cancelled: set[int]
) -> None:
    chunks: Any = None
    try:
        chunks = engine.stream(request)
        for chunk in chunks:
            if rid in cancelled:
                send(("err", rid, ("EngineAsleepError", _CANCELLED)))  # the waiter must end
                return
            send(("chunk", rid, chunk))
        send(("end", rid, None))
    except (ArgosyError, ValueError, RuntimeError) as err:
        send(("err", rid, (type(err).__name__, str(err))))
    except Exception as err:  # OSError, IndexError...: the waiter must end, the worker lives
        log.exception("stream %d failed", rid)
        failed = f"the engine failed on this request ({type(err).__name__})"
        send(("err", rid, ("EngineFailedError", failed)))
    finally:
        if chunks is not None:
            chunks.close()
        cancelled.discard(rid)
