"""From engine chunks to the pieces an OpenAI response is built of, and the SSE stream.

`pieces(engine, request, stops, index)` turns one request's engine chunks into `Piece`s
(text delta, finish reason, token count, logprobs), cut at the first stop string;
`merge` interleaves several requests' pieces (the `n` choices, or a list of prompts)
round robin, which costs nothing since the batch loop advances them together; `drain`
collects them into whole choices. `sse` is the server-sent event stream of one response:
every piece is pulled on a thread of the stream pool (never the event loop's), an error
raised mid-stream (the engine went to sleep, the worker failed) becomes an `error` event
instead of a dropped connection, and the request's admission slot and engine generators
are released however the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anyio

from argosy.serving.errors import EngineAsleepError, EngineFailedError
from argosy.serving.shapes import Shape, error_body
from argosy.serving.stops import StopMatcher
from argosy.serving.types import GenerationRequest


@dataclass(frozen=True)
class Piece:
    """One step of one choice: a text delta, and `finish` on its last step."""

    index: int
    text: str
    finish: str | None
    tokens: int
    logprobs: tuple[Any, ...] = ()
    """`TokenLogprob`s of the step's tokens (when the request asked for them)."""


@dataclass
class Choice:
    """A whole choice, collected from its pieces."""

    index: int
    text: str = ""
    finish: str = "length"
    tokens: int = 0
    logprobs: list[Any] = field(default_factory=list)


def pieces(
    engine: Any, request: GenerationRequest, stops: Sequence[str], index: int
) -> Iterator[Piece]:
    """`index`'s pieces as the engine decides its tokens, cut at the first stop string."""
    matcher = StopMatcher(list(stops))
    chunks = engine.stream(request)
    try:
        for chunk in chunks:
            delta, hit = matcher.feed(chunk.text)
            logprobs = tuple(getattr(chunk, "logprobs", ()))
            if hit:
                text = delta + matcher.flush_before_stop()
                yield Piece(index, text, "stop", len(chunk.token_ids), logprobs)
                return
            finish = chunk.finish_reason
            text = delta + (matcher.flush() if finish else "")
            yield Piece(index, text, finish, len(chunk.token_ids), logprobs)
            if finish:
                return
    finally:
        chunks.close()


def merge(streams: Sequence[Iterator[Piece]]) -> Iterator[Piece]:
    """Pieces of several choices, one from each unfinished choice in turn. The choices'
    first pieces are pulled together (one thread each), so their requests reach the
    engine at once and are prefilled in one batched pass."""
    try:
        live = []
        for stream, piece in zip(streams, _first_pieces(streams), strict=True):
            if piece is not None:
                yield piece
                if piece.finish is None:
                    live.append(stream)
        while live:
            for stream in list(live):
                piece = next(stream, None)
                if piece is None:
                    live.remove(stream)
                    continue
                yield piece
                if piece.finish is not None:
                    live.remove(stream)
    finally:
        for stream in streams:
            close = getattr(stream, "close", None)
            if close is not None:
                close()


def _first_pieces(streams: Sequence[Iterator[Piece]]) -> list[Piece | None]:
    if len(streams) == 1:
        return [next(streams[0], None)]
    with ThreadPoolExecutor(len(streams), thread_name_prefix="argosy-choice") as pool:
        return list(pool.map(lambda stream: next(stream, None), streams))


def drain(stream: Iterator[Piece], count: int) -> list[Choice]:
    """Every choice of `stream`, whole, in index order."""
    choices = [Choice(i) for i in range(count)]
    for piece in stream:
        choice = choices[piece.index]
        choice.text += piece.text
        choice.tokens += piece.tokens
        choice.logprobs.extend(piece.logprobs)
        choice.finish = piece.finish or choice.finish
    return choices


_DONE = object()


@dataclass
class StreamPlan:
    """What one SSE response needs: its pieces (the first already pulled), its shape,
    and what to do at the end."""

    first: Piece | None
    rest: Iterator[Piece]
    shape: Shape
    choices: int
    prompt_tokens: int
    include_usage: bool
    release: Callable[[], None]
    limiter: anyio.CapacityLimiter
    role_chunk: bool = True
    prefix: dict[int, str] = field(default_factory=dict)
    """Text each choice starts with (`echo`)."""


async def sse(plan: StreamPlan) -> AsyncIterator[str]:
    """Server-sent events of one response; an error mid-stream is an `error` event."""
    counts = [0] * plan.choices
    try:
        for index in range(plan.choices):
            if plan.role_chunk:
                yield _event(plan.shape.role_chunk(index))
            if plan.prefix.get(index):
                yield _event(plan.shape.chunk(Piece(index, plan.prefix[index], None, 0)))
        item: Any = plan.first
        while item is not None and item is not _DONE:
            counts[item.index] += item.tokens
            yield _event(plan.shape.chunk(item))
            item = await anyio.to_thread.run_sync(next, plan.rest, _DONE, limiter=plan.limiter)
        if plan.include_usage:
            yield _event(plan.shape.usage_chunk(plan.prompt_tokens, sum(counts)))
        yield "data: [DONE]\n\n"
    except EngineAsleepError as err:
        yield _event(error_body(503, str(err), None, "engine_asleep"))
    except (EngineFailedError, ValueError, RuntimeError) as err:
        yield _event(error_body(500, str(err), None, "engine_error"))
    except Exception as err:  # anything else ends the stream with its kind, not its words
        message = f"the engine failed mid-stream ({type(err).__name__})"
        yield _event(error_body(500, message, None, "engine_error"))
    finally:
        close = getattr(plan.rest, "close", None)
        if close is not None:
            close()
        plan.release()


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
