"""Limits that keep one HTTP process answering under load: the body size, the prompt size,
the number of requests admitted at once, and the thread pools requests run on.

- `ServingLimits`: the knobs (pydantic, every field with a default).
- `BodyLimit`: an ASGI middleware that refuses a body over `max_body_bytes` with a 413
  naming the limit, from `Content-Length` before anything is read, or while a chunked body
  streams in, so an oversized body is never parsed, tokenized or kept.
- `Admission`: a counter of requests in flight (queued in the engine or decoding); past
  `max_pending_requests` a request gets 429 with `Retry-After` instead of a queue slot.
- `Pools`: three thread limiters, so no kind of work waits for another: `streams` (one
  thread per request while it decodes), `tokenize` (encoding prompts, off the event loop)
  and `control` (`/metrics`, admin calls). `/health`, `/live` and `/v1/models` use none:
  they answer from the event loop without touching the engine's worker.
- `trim_memory`: after a request with a big body (`BodyLimit` calls it once the response
  is sent), collect garbage and hand freed heap pages back to the OS.
"""

from __future__ import annotations

import ctypes
import gc
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class ServingLimits(BaseModel):
    """What one `argosy serve` process accepts at once."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_body_bytes: int = Field(default=2 * 2**20, ge=1024)
    """Largest request body; a bigger one is a 413 before it is parsed."""

    max_prompt_chars: int = Field(default=0, ge=0)
    """Most characters of prompt text (all messages together), checked before tokenizing
    (400 naming it); 0: 16 x the model's context in tokens."""

    max_pending_requests: int = Field(default=256, ge=1)
    """Requests admitted at once (decoding plus queued in the engine); more get 429."""

    retry_after_s: int = Field(default=1, ge=0)
    """`Retry-After` of a 429 (the admission queue is full)."""

    asleep_retry_after_s: int = Field(default=10, ge=0)
    """`Retry-After` of a 503 while the engine sleeps."""

    tokenize_threads: int = Field(default=4, ge=1)
    """Threads that tokenize prompts (off the event loop)."""

    control_threads: int = Field(default=4, ge=1)
    """Threads for `/metrics` and admin calls (never shared with streams)."""

    trim_after_bytes: int = Field(default=2**20, ge=0)
    """After a request whose body was at least this big, collect garbage and return freed
    heap pages to the OS (0: never)."""

    def prompt_chars(self, context_tokens: int) -> int:
        """The prompt character limit for a model with `context_tokens` of context."""
        return self.max_prompt_chars or 16 * context_tokens


class Pools:
    """Separate thread limiters for streams, tokenization and control calls."""

    def __init__(self, limits: ServingLimits) -> None:
        self.streams = anyio.CapacityLimiter(limits.max_pending_requests + 8)
        self.tokenize = anyio.CapacityLimiter(limits.tokenize_threads)
        self.control = anyio.CapacityLimiter(limits.control_threads)


class QueueFullError(Exception):
    """Too many requests in flight: a 429 with `Retry-After`."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"too many requests in flight ({limit}, max_pending_requests); retry later"
        )
        self.retry_after_s = retry_after_s


class Admission:
    """Counts requests in flight; used from the event loop only (no lock needed)."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit, self.retry_after_s = limit, retry_after_s
        self.in_flight = 0

    def enter(self) -> None:
        """Take a slot, or raise `QueueFullError`."""
        if self.in_flight >= self.limit:
            raise QueueFullError(self.limit, self.retry_after_s)
        self.in_flight += 1

    def leave(self) -> None:
        """Give the slot back."""
        self.in_flight -= 1


class BodyLimit:
    """ASGI middleware: a 413 for bodies over `max_bytes`, before the app reads them; after
    a request whose body reached `trim_after_bytes` (0: never), `trim` runs on a thread."""

    def __init__(
        self,
        app: App,
        max_bytes: int,
        trim_after_bytes: int = 0,
        trim: Callable[[], None] | None = None,
    ) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.trim_after_bytes = trim_after_bytes
        self.trim = trim or trim_memory

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, declared)
            return
        seen = 0
        started = refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes and not refused:
                refused = True
                if not started:
                    await self._refuse(send, seen)
                return {"type": "http.disconnect"}  # the app stops reading
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out; whatever the app answers is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        finally:
            if self.trim_after_bytes and seen >= self.trim_after_bytes:
                await anyio.to_thread.run_sync(self.trim)

    async def _refuse(self, send: Send, size: int) -> None:
        message = (
            f"request body is {size} bytes or more; this server accepts at most "
            f"{self.max_bytes} (max_body_bytes)"
        )
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "max_body_bytes",
                "code": "request_too_large",
            }
        }
        payload = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def trim_memory() -> None:
    """Collect garbage and ask glibc to return freed heap pages to the OS (no-op elsewhere)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return
