"""The OpenAI-compatible HTTP API over one engine: `/v1/models`, `/v1/completions`,
`/v1/chat/completions` (JSON or server-sent events), `/metrics`, `/health`.

Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with `param`
naming the offending field: 400 for invalid fields, malformed JSON and oversized prompts,
404 for an unknown model, 503 while the engine sleeps. `/admin/*` (see `admin.py`) lets a
control plane put the engine to sleep and wake it. Each request decodes in a worker
thread; when a streaming client disconnects, its generator is closed and the engine goes
on serving the others.

    app = build_app(engine, served_name="smollm2-135m")
    uvicorn.run(app, port=8000)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from argosy.core.errors import UnknownNameError
from argosy.serving.admin import AdminDeniedError, install_admin_routes
from argosy.serving.errors import EngineAsleepError, EngineFailedError
from argosy.serving.metrics import render_metrics
from argosy.serving.schema import ChatBody, CompletionBody
from argosy.serving.stops import StopMatcher
from argosy.serving.types import GenerationRequest


class ApiError(Exception):
    """A client error with the field it concerns."""

    def __init__(self, status: int, message: str, param: str | None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def build_app(engine: Any, served_name: str, admin_token: str | None = None) -> FastAPI:
    """An app serving `engine` under `served_name`; `admin_token` enables `/admin/*`."""
    app = FastAPI(title="argosy serve", docs_url=None, redoc_url=None)
    _install_error_handlers(app)
    install_admin_routes(app, engine, admin_token)
    created = int(time.time())

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "asleep" if engine.stats().asleep else "ok"}

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        card = {"id": served_name, "object": "model", "created": created, "owned_by": "argosy"}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(engine.stats()))

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Any:
        _check_model(body.model, served_name)
        ids = engine.encode(body.prompt)
        return await _respond(engine, body, ids, "prompt", _completion_shape(served_name))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request) -> Any:
        _check_model(body.model, served_name)
        ids = engine.encode_chat([m.model_dump() for m in body.messages])
        return await _respond(engine, body, ids, "messages", _chat_shape(served_name))

    return app


def _check_model(name: str, served_name: str) -> None:
    if name != served_name:
        raise ApiError(404, f"model '{name}' is not served here; use '{served_name}'", "model")


async def _respond(
    engine: Any, body: CompletionBody | ChatBody, ids: list[int], field: str, shape: _Shape
) -> Any:
    params = body.sampling()
    limit = engine.max_context_tokens
    if len(ids) + params.max_tokens > limit:
        msg = (
            f"{field} is {len(ids)} tokens; with max_tokens {params.max_tokens} it exceeds {limit}"
        )
        raise ApiError(400, msg, field)
    if body.speculative is not None:
        _check_speculative(body.speculative)
    request = GenerationRequest(tuple(ids), params, body.speculative)
    chunks = _text_chunks(engine, request, body.stop_strings())
    if body.stream:
        wants_usage = body.stream_options is not None and body.stream_options.include_usage
        events = _sse(chunks, shape, len(ids) if wants_usage else None)
        return StreamingResponse(events, media_type="text/event-stream")
    text, finish, count = await anyio.to_thread.run_sync(_drain, chunks)
    return shape.full(text, finish, _usage(len(ids), count))


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _check_speculative(spec: str) -> None:
    from argosy.serving.speculative import PROPOSERS, split_spec

    name, _ = split_spec(spec)
    if name != "off" and name not in PROPOSERS:
        known = ", ".join(["off", *PROPOSERS.known()])
        raise ApiError(400, f"unknown speculative '{spec}'; known: {known}", "speculative")


def _text_chunks(engine: Any, request: GenerationRequest, stops: list[str]) -> Iterator[Any]:
    """(text delta, finish_reason, num_tokens) per engine step, cut at the first stop string."""
    matcher = StopMatcher(stops)
    for chunk in engine.stream(request):
        delta, hit = matcher.feed(chunk.text)
        if hit:
            yield delta + matcher.flush_before_stop(), "stop", len(chunk.token_ids)
            return
        finish = chunk.finish_reason
        yield delta + (matcher.flush() if finish else ""), finish, len(chunk.token_ids)
        if finish:
            return


def _drain(chunks: Iterator[Any]) -> tuple[str, str, int]:
    text, finish, count = "", "length", 0
    for delta, reason, num in chunks:
        text, count = text + delta, count + num
        finish = reason or finish
    return text, finish, count


_DONE = object()


async def _sse(
    chunks: Iterator[Any], shape: _Shape, usage_of_prompt: int | None = None
) -> AsyncIterator[str]:
    """Server-sent events; the engine generator is closed however the stream ends. With
    `usage_of_prompt` (the prompt's token count) a usage chunk precedes `[DONE]`."""
    count = 0
    try:
        while True:
            item = await anyio.to_thread.run_sync(next, chunks, _DONE)
            if item is _DONE:
                break
            delta, finish, num = item
            count += num
            yield f"data: {json.dumps(shape.delta(delta, finish))}\n\n"
        if usage_of_prompt is not None:
            last = {**shape.delta("", None), "choices": [], "usage": _usage(usage_of_prompt, count)}
            yield f"data: {json.dumps(last)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class _Shape:
    """Builds the OpenAI response objects of one endpoint."""

    def __init__(self, model: str, kind: str) -> None:
        self.model, self.kind = model, kind
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
            body = self._base("chat.completion")
        else:
            choice, body = (
                {"index": 0, "text": text, "logprobs": None},
                self._base("text_completion"),
            )
        choice["finish_reason"] = finish
        return {**body, "choices": [choice], "usage": usage}

    def delta(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}}
            body = self._base("chat.completion.chunk")
        else:
            choice, body = (
                {"index": 0, "text": text, "logprobs": None},
                self._base("text_completion"),
            )
        choice["finish_reason"] = finish
        return {**body, "choices": [choice]}


def _completion_shape(model: str) -> _Shape:
    return _Shape(model, "text")


def _chat_shape(model: str) -> _Shape:
    return _Shape(model, "chat")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return _error(err.status, err.message, err.param)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        if first.get("type") == "json_invalid":
            return _error(400, f"malformed JSON: {first.get('msg')}", "body")
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or "body"
        return _error(400, f"{param}: {first.get('msg')}", param)

    @app.exception_handler(AdminDeniedError)
    async def denied(_: Request, err: AdminDeniedError) -> JSONResponse:
        return _error(err.status, err.message, "authorization")

    @app.exception_handler(EngineAsleepError)
    async def asleep(_: Request, err: EngineAsleepError) -> JSONResponse:
        return _error(503, str(err), None)

    @app.exception_handler(EngineFailedError)
    async def failed(_: Request, err: EngineFailedError) -> JSONResponse:
        return _error(500, str(err), None)

    @app.exception_handler(UnknownNameError)
    async def unknown(_: Request, err: UnknownNameError) -> JSONResponse:
        return _error(400, str(err), None)


def _error(status: int, message: str, param: str | None) -> JSONResponse:
    kinds = {404: "not_found_error", 401: "authentication_error", 503: "service_unavailable"}
    kind = kinds.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)
