"""Admin routes for a control plane: sleep and wake the engine (the tidal lease hook).

    POST /admin/sleep   {"level": 1 | 2}   -> {"state": "asleep", "level", "seconds", ...}
    POST /admin/wake                        -> {"state": "awake", "seconds", ...}
    GET  /admin/state                       -> {"state", "level", "resident_bytes",
                                                "worker_start", "memory_budget", "pids",
                                                "memory"}

Every route needs `Authorization: Bearer <token>`; without a configured token the routes
answer 404 (disabled), and a wrong token is a 401. Sleep stops admitting requests (new
ones get 503 until wake), lets requests in flight finish within the engine's drain
timeout, then releases memory; both calls are idempotent and report how long they took
and the service's resident memory before and after. `resident_bytes` is the RSS of the HTTP
process plus its worker; `memory` splits it by process (`http`, `worker`, and the node's
shared `zygote` when the worker was forked from one): RSS, anonymous, file-backed and
shared-memory pages, PSS and USS, in bytes (null for a process that is not running).
`memory_budget` is the service's share of its device (`--memory-fraction`: the budget, the
weights, the KV budget and capacity in tokens, and the tokens reserved by running
requests), or null without one.

The replica's proof (`replica_proof`): a replica started by `argosy server` gets a
per-service proof key in `$ARGOSY_REPLICA_PROOF_KEY`, and answers `GET /live?nonce=N`
with `"proof"`: the HMAC-SHA256 under that key of N and the `host:port` it was started to
listen on. The control plane sends a fresh nonce with every probe and takes a replica as
ready only with the right proof, so a process that holds the port first (another tenant)
is never mistaken for the replica; binding `host:port` in keeps one replica of a service
from vouching for another's port. The key itself never crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from typing import Any

import anyio
from fastapi import FastAPI, Header
from pydantic import BaseModel, ConfigDict, Field

from argosy.serving.memory import rss_bytes

PROOF_KEY_ENV = "ARGOSY_REPLICA_PROOF_KEY"
"""The environment variable that hands a replica its proof key (never its command line)."""
MAX_NONCE_CHARS = 128


def replica_proof(key: bytes, nonce: str, where: str) -> str:
    """The proof a replica listening on `where` (`host:port`) gives for `nonce`."""
    return hmac.new(key, f"{nonce}\0{where}".encode(), hashlib.sha256).hexdigest()


def proof_matches(key: bytes, nonce: str, where: str, answer: str) -> bool:
    """Whether `answer` is the proof for `nonce` at `where` (compared in constant time)."""
    return hmac.compare_digest(replica_proof(key, nonce, where).encode(), answer.encode())


class SleepBody(BaseModel):
    """`POST /admin/sleep`."""

    model_config = ConfigDict(extra="forbid")

    level: int = Field(default=2, ge=1, le=2)
    """1: drop weights and KV, keep the worker (fast wake); 2: stop the worker (frees most)."""


class AdminDeniedError(Exception):
    """A missing, wrong or disabled admin token."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def install_admin_routes(app: FastAPI, engine: Any, token: str | None) -> None:
    """Add `/admin/*` to `app`; they check `token` on every call."""

    def check(authorization: str | None) -> None:
        if not token:
            raise AdminDeniedError(404, "admin routes are disabled: start with --admin-token")
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise AdminDeniedError(401, "missing or wrong admin token (Authorization: Bearer ...)")

    @app.get("/admin/state")
    async def state(authorization: str | None = Header(default=None)) -> dict[str, Any]:
        check(authorization)
        return _state(engine)

    @app.post("/admin/sleep")
    async def sleep(
        body: SleepBody | None = None, authorization: str | None = Header(default=None)
    ) -> dict[str, Any]:
        check(authorization)
        level = (body or SleepBody()).level
        before = _resident(engine)
        start = time.perf_counter()
        await anyio.to_thread.run_sync(_sleep, engine, level)
        seconds = time.perf_counter() - start
        return {**_state(engine), "seconds": seconds, "resident_bytes_before": before}

    @app.post("/admin/wake")
    async def wake(authorization: str | None = Header(default=None)) -> dict[str, Any]:
        check(authorization)
        before = _resident(engine)
        start = time.perf_counter()
        await anyio.to_thread.run_sync(engine.wake)
        seconds = time.perf_counter() - start
        return {**_state(engine), "seconds": seconds, "resident_bytes_before": before}


def _sleep(engine: Any, level: int) -> None:
    engine.sleep(level)


def _state(engine: Any) -> dict[str, Any]:
    level = int(getattr(engine, "sleep_level", 1 if engine.stats().asleep else 0))
    return {
        "state": "asleep" if level else "awake",
        "level": level,
        "resident_bytes": _resident(engine),
        "worker_start": getattr(engine, "worker_start", "none"),
        "memory_budget": _budget(engine),
        **_processes(engine),
    }


def _budget(engine: Any) -> dict[str, Any] | None:
    """The service's memory budget and how much of its KV capacity is reserved (None
    without a memory fraction)."""
    stats = engine.stats()
    if not stats.budget:
        return None
    return {**stats.budget, "kv_reserved_tokens": stats.kv_reserved_tokens}


def _processes(engine: Any) -> dict[str, Any]:
    """`pids` and `memory` by role, for an engine that runs in a worker process."""
    if not hasattr(engine, "memory"):
        return {"pids": {"http": os.getpid()}, "memory": {}}
    memory = engine.memory()
    return {
        "pids": engine.pids(),
        "memory": {role: m.as_dict() if m else None for role, m in memory.items()},
    }


def _resident(engine: Any) -> int:
    measure = getattr(engine, "resident_bytes", None)
    if measure is not None:
        return int(measure())
    return rss_bytes(os.getpid())
