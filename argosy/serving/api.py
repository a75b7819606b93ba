"""The OpenAI-compatible HTTP API over one engine: `/v1/models`, `/v1/models/{id}`,
`/v1/completions`, `/v1/chat/completions` (JSON or server-sent events), `/metrics`,
`/health` (readiness) and `/live` (liveness).

What it guarantees under load (`limits.py`):
- `/live`, `/health` and `/v1/models` answer from the event loop without calling the
  engine's worker, so they never wait for generation; `/metrics` runs on its own threads;
- prompts are tokenized on their own threads, never on the event loop; each stream pulls
  its pieces on a thread of the stream pool, which nothing else shares;
- bodies over `max_body_bytes` are a 413 and prompts over `max_prompt_chars` a 400 naming
  the limit, before anything is tokenized; past `max_pending_requests` in flight a request
  is a 429 with `Retry-After`;
- while the engine sleeps a new request (streaming or not) is a 503 with `Retry-After`
  before any byte of a stream is sent, `/health` is a 503 and `/live` stays 200; a stream
  cut by a sleep ends with an SSE `error` event.
- `/live?nonce=N` on a replica given a proof key (`argosy.serving.admin.replica_proof`)
  also answers `"proof"`, which tells the control plane this is the replica it started.

Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with `param`
naming the offending field: 400 for invalid fields, malformed JSON and oversized prompts,
404 for an unknown model or route. `/admin/*` (see `admin.py`) lets a control plane put the
engine to sleep and wake it.

    app = build_app(engine, served_name="smollm2-135m")
    uvicorn.run(app, port=8000)
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from argosy.core.same_origin import BrowserGuard, host_names
from argosy.serving.admin import MAX_NONCE_CHARS, install_admin_routes, replica_proof
from argosy.serving.api_key import ApiKeyGuard
from argosy.serving.energy_metrics import ServingEnergy
from argosy.serving.errors import EngineAsleepError
from argosy.serving.errors_http import ApiError, install_error_handlers
from argosy.serving.limits import Admission, BodyLimit, Pools, ServingLimits
from argosy.serving.metrics import render_metrics
from argosy.serving.schema import ChatBody, CompletionBody
from argosy.serving.shapes import error_body
from argosy.serving.streaming import StreamPlan, drain, merge, pieces, sse

ENV_ALLOWED_HOSTS = "ARGOSY_SERVE_ALLOWED_HOSTS"
"""Host names a service without an API key answers besides localhost and IP addresses."""


class Server:
    """What the routes share: the engine, its name, the limits, pools and admission."""

    def __init__(self, engine: Any, served_name: str, limits: ServingLimits) -> None:
        self.engine, self.name, self.limits = engine, served_name, limits
        self.pools = Pools(limits)
        self.admission = Admission(limits.max_pending_requests, limits.retry_after_s)
        self.created = int(time.time())
        self.energy = ServingEnergy.open()  # joules per token and watts in /metrics

    def asleep(self) -> bool:
        """Whether the engine refuses new requests now (no call to a worker process)."""
        flag = getattr(self.engine, "asleep", None)
        return bool(flag) if flag is not None else bool(self.engine.stats().asleep)

    def card(self) -> dict[str, Any]:
        """The served model as `/v1/models` lists it."""
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "argosy"}

    def check_model(self, name: str) -> None:
        """404 (OpenAI's `model_not_found`) for a model not served here."""
        if name != self.name:
            message = f"model '{name}' is not served here; use '{self.name}'"
            raise ApiError(404, message, "model", "model_not_found")

    def check_prompt(self, chars: int, field: str) -> None:
        """400 for prompt text over `max_prompt_chars`, before it is tokenized."""
        limit = self.limits.prompt_chars(self.context())
        if chars > limit:
            message = f"{field} is {chars} characters; at most {limit} (max_prompt_chars)"
            raise ApiError(400, message, field, "max_prompt_chars")

    def check_awake(self) -> None:
        """503 (with `Retry-After`) while the engine sleeps."""
        if self.asleep():
            raise EngineAsleepError("the engine is asleep; retry after it wakes")

    def context(self) -> int:
        """The model's context in tokens (prompt plus completion)."""
        return int(self.engine.max_context_tokens)

    async def tokenize(self, call: Any, *args: Any) -> Any:
        """`call(*args)` on the tokenizer threads."""
        return await anyio.to_thread.run_sync(call, *args, limiter=self.pools.tokenize)


def build_app(
    engine: Any,
    served_name: str,
    admin_token: str | None = None,
    limits: ServingLimits | None = None,
    api_key: str | None = None,
    proof_key: bytes | None = None,
    address: str = "",
) -> FastAPI:
    """An app serving `engine` under `served_name`; `admin_token` enables `/admin/*`,
    `api_key` guards `/v1/*` (`argosy.serving.api_key`), `proof_key` makes `/live?nonce=`
    prove this is the replica started to listen on `address` (`host:port`)."""
    limits = limits or ServingLimits()
    app = FastAPI(title="argosy serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        BodyLimit, max_bytes=limits.max_body_bytes, trim_after_bytes=limits.trim_after_bytes
    )
    app.add_middleware(ApiKeyGuard, key=api_key)  # no key, nothing read
    app.add_middleware(  # the outermost: Host and Origin first; nosniff on every answer
        BrowserGuard,
        check=api_key is None,  # with a key, the key is the guard (DNS rebinding: docs)
        extra_hosts=host_names(os.environ.get(ENV_ALLOWED_HOSTS, "")),
        error_body=lambda status, message, code: error_body(status, message, None, code),
        hint=f"; set {ENV_ALLOWED_HOSTS}=name,... to allow other names",
    )
    server = Server(engine, served_name, limits)
    app.state.server = server
    install_error_handlers(app, limits)
    install_admin_routes(app, engine, admin_token)
    _install_probes(app, server, proof_key, address)
    _install_generation(app, server)
    return app


def _install_probes(app: FastAPI, server: Server, proof_key: bytes | None, address: str) -> None:
    @app.get("/live")
    async def live(
        nonce: str | None = Query(default=None, max_length=MAX_NONCE_CHARS),
    ) -> dict[str, str]:
        if proof_key is None or nonce is None:
            return {"status": "alive"}
        return {"status": "alive", "proof": replica_proof(proof_key, nonce, address)}

    @app.get("/health")
    async def health() -> Any:
        if server.asleep():
            headers = {"Retry-After": str(server.limits.asleep_retry_after_s)}
            return JSONResponse({"status": "asleep"}, status_code=503, headers=headers)
        return {"status": "ok", "in_flight": server.admission.in_flight}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [server.card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        server.check_model(model_id)
        return server.card()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        stats = await anyio.to_thread.run_sync(server.engine.stats, limiter=server.pools.control)
        text = render_metrics(stats, server.energy) + _admission_metrics(server)
        return PlainTextResponse(text)


def _admission_metrics(server: Server) -> str:
    rows = [
        ("argosy_serving_http_in_flight", server.admission.in_flight),
        ("argosy_serving_http_max_pending", server.admission.limit),
    ]
    return "".join(f"# TYPE {name} gauge\n{name} {value}\n" for name, value in rows)


def _install_generation(app: FastAPI, server: Server) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> Any:
        from argosy.serving.openai_surface import completion_prompts

        server.check_model(body.model)
        return await _generate(server, body, completion_prompts)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody) -> Any:
        from argosy.serving.openai_surface import chat_prompts

        server.check_model(body.model)
        return await _generate(server, body, chat_prompts)


async def _generate(server: Server, body: Any, prepare: Any) -> Any:
    """Admit, tokenize, then answer as JSON or as a stream."""
    server.check_awake()
    server.admission.enter()
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            server.admission.leave()

    handed_over = False
    try:
        job = await prepare(server, body)
        streams = [
            pieces(server.engine, request, job.stops, index)
            for index, request in enumerate(job.requests)
        ]
        merged = merge(streams)
        limiter = server.pools.streams
        if not body.stream:
            choices = await anyio.to_thread.run_sync(drain, merged, len(streams), limiter=limiter)
            return job.finish(choices)
        first = await anyio.to_thread.run_sync(next, merged, None, limiter=limiter)
        plan = StreamPlan(
            first=first,
            rest=merged,
            shape=job.shape,
            choices=len(streams),
            prompt_tokens=job.prompt_tokens,
            include_usage=body.include_usage,
            release=release,
            limiter=limiter,
            role_chunk=job.shape.kind == "chat",
            prefix=job.prefix,
        )
        handed_over = True
        return StreamingResponse(sse(plan), media_type="text/event-stream")
    finally:
        if not handed_over:
            release()
