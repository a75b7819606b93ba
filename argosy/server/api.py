"""REST routes under /api/v1. Every route but /health needs a bearer token; changes to a
queue's jobs need an admin token or that queue's token (401 without a valid token, 403
across queues)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import Field

from argosy.core.errors import ArgosyError
from argosy.core.same_origin import UNSAFE_METHODS
from argosy.server.admission import refuse_unless_runnable
from argosy.server.auth import Principal
from argosy.server.control import Control, NotFoundError
from argosy.server.field_errors import field_errors
from argosy.server.node_control import NodeBusyError
from argosy.server.queue_limits import QueueFullError
from argosy.server.rate_limits import refuse_if_too_fast
from argosy.server.schemas import (
    ErrorBody,
    EventPage,
    Health,
    Job,
    JobPage,
    JobState,
    NodeView,
    QueueInfo,
)
from argosy.server.spec import JobSpec
from argosy.server.store import IdempotencyConflictError
from argosy.server.views import (
    event_view,
    job_json,
    job_view,
    latest_rank_log,
    launcher_error,
    launcher_log,
    log_name,
    queue_views,
    read_log_chunk,
)

COMMON = {  # what any route may answer besides its own codes
    400: {"model": ErrorBody, "description": "Malformed request (e.g. a body that is not JSON)"},
    401: {"model": ErrorBody, "description": "Missing or unknown token"},
    429: {"model": ErrorBody, "description": "A change past the token's rate (Retry-After)"},
    413: {"model": ErrorBody, "description": "Request body over its cap (max_body_bytes)"},
    422: {"description": "Invalid input, or a request that can never be met"},
}
router = APIRouter(prefix="/api/v1", responses=COMMON)
LOG_CHUNK_BYTES = 1 << 20


async def control(request: Request) -> Control:
    """The control loop (async: a plain function would cost a thread hop per request)."""
    return request.app.state.control


async def principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    scheme, _, token = (authorization or "").partition(" ")
    found = (
        request.app.state.tokens.principal(token.strip()) if scheme.lower() == "bearer" else None
    )
    if found is None:
        raise HTTPException(401, "missing or unknown token", {"WWW-Authenticate": "Bearer"})
    request.state.actor = found.actor  # the access log's actor (argosy.server.access_log)
    if request.method in UNSAFE_METHODS:
        refuse_if_too_fast(request, found)
    return found


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.is_admin:
        raise HTTPException(403, "needs an admin token")
    return who


Ctl = Annotated[Control, Depends(control)]
Who = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
Limit = Annotated[int, Query(ge=1, le=500)]
Cursor = Annotated[int, Query(ge=0, le=2**62)]
LAUNCHER = "launcher"
LogRank = Annotated[
    Literal["launcher"] | Annotated[int, Field(ge=0, le=100_000)],
    Query(description="A rank number, or `launcher` for the launcher's own output."),
]


@router.get("/health")
async def health() -> Health:
    """Liveness; no token needed."""
    return Health(status="ok")


@router.post(
    "/jobs",
    status_code=201,
    response_model=Job,
    responses={200: {"model": Job}, 403: {}, 409: {}, 422: {}, 429: {}},
)
async def submit(
    spec: JobSpec,
    ctl: Ctl,
    who: Who,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Submit a job. A repeated `Idempotency-Key` with the same body returns the first job
    (200) instead of a new one; with a different body it is a 409. Keys are the token's
    own: another token's key neither clashes nor answers (no oracle, no squatting on a
    key another tenant will send). A queue that already has `max_pending_jobs_per_queue`
    jobs waiting to start gets a 429 naming the limit. A job that could never
    run here (missing or relative workdir, a script that is missing, unreadable, outside
    its workdir or not runnable, arguments over the OS limit) is a 422 naming the field."""
    if not who.may_change(spec.queue):
        raise HTTPException(403, f"this token may submit only to queue '{who.queue}'")
    # a 422 naming the field: it could never run
    refuse_unless_runnable(spec, ctl.readable, ctl.job_user(spec.queue))
    digest, scoped = "", None  # what a repeated Idempotency-Key is compared by
    if idempotency_key is not None:
        body = json.dumps(spec.model_dump(), sort_keys=True).encode()
        digest = hashlib.sha256(body).hexdigest()
        scoped = _token_scoped(who, idempotency_key)
    try:
        row, created = ctl.submit(spec, scoped, digest, actor=who.actor)
    except IdempotencyConflictError:
        msg = f"Idempotency-Key '{idempotency_key}' was used with another body"
        raise HTTPException(409, msg) from None
    except QueueFullError as err:
        raise HTTPException(429, str(err)) from None
    except ArgosyError as err:
        raise HTTPException(422, field_errors(err)) from err
    body = job_view(row).model_dump_json()  # built once, not validated a second time
    return Response(body, status_code=201 if created else 200, media_type="application/json")


def _token_scoped(who, key: str) -> str:
    """The stored form of a token's Idempotency-Key: a digest of the token id and the key."""
    owner = who.token_id or who.actor
    return "k" + hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()


@router.get("/jobs", response_model=JobPage)
async def list_jobs(
    ctl: Ctl,
    who: Who,
    state: Annotated[list[JobState] | None, Query()] = None,
    queue: Annotated[str | None, Query(max_length=100)] = None,
    name: Annotated[str | None, Query(max_length=100)] = None,
    cursor: Cursor = 0,
    limit: Limit = 100,
) -> Response:
    """Jobs in submit order, filtered by state (repeatable), queue and name; each a slim
    row (`slim_row`: no `spec.args`, no `summary`), the whole job from GET /jobs/{id}."""
    rows, nxt = ctl.store.list_jobs(
        states=state or (), queue=queue, name=name, cursor=cursor, limit=limit, raw_json=True
    )
    items = ",".join(job_json(slim_row(r)) for r in rows)  # JobPage, written out directly
    body = f'{{"items":[{items}],"next_cursor":{json.dumps(nxt)}}}'
    return Response(body, media_type="application/json")


def slim_row(row: dict) -> dict:
    """A listed job's row: its spec without `args` and no `summary`, the two parts a job's
    submitter or the job itself sizes (a page of them stays small whatever they hold)."""
    try:
        spec = json.loads(row["spec"]) if isinstance(row["spec"], str) else dict(row["spec"])
    except ValueError:
        return row
    if isinstance(spec, dict):
        spec.pop("args", None)
    return {**row, "spec": json.dumps(spec), "summary": None}


@router.get("/jobs/{job_id}", response_model=Job, responses={404: {}})
async def get_job(job_id: str, ctl: Ctl, who: Who) -> Response:
    row = _job(ctl, job_id)
    view = job_view(row)  # built once, not validated again
    if row["state"] == "failed" and who.may_read_output(row["queue"]):
        view.error = launcher_error(ctl.run_dir(job_id), row["attempts"]) or None
    if row["state"] == "pending":
        from argosy.server.console.overview import pending_wait  # (the queues page's words)

        view.waiting = pending_wait(ctl, row) or None
    return Response(view.model_dump_json(), media_type="application/json")


@router.post("/jobs/{job_id}/cancel", responses={403: {}, 404: {}})
async def cancel(job_id: str, ctl: Ctl, who: Who) -> Job:
    """Cancel a job: a pending one at once, a running one once its attempt has stopped."""
    row = _job(ctl, job_id)
    if not who.may_change(row["queue"]):
        raise HTTPException(403, f"this token may cancel only in queue '{who.queue}'")
    return job_view(ctl.cancel(job_id, actor=who.actor))


@router.get("/jobs/{job_id}/events", responses={404: {}})
async def job_events(
    job_id: str, ctl: Ctl, who: Who, cursor: Cursor = 0, limit: Limit = 100
) -> EventPage:
    _job(ctl, job_id)
    rows, nxt = ctl.store.list_events(job_id=job_id, cursor=cursor, limit=limit)
    return EventPage(items=[event_view(r) for r in rows], next_cursor=nxt)


@router.get("/jobs/{job_id}/logs", response_class=PlainTextResponse, responses={403: {}, 404: {}})
async def job_logs(
    job_id: str,
    ctl: Ctl,
    who: Who,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    rank: LogRank = 0,
    file: Annotated[str | None, Query(max_length=300)] = None,
) -> PlainTextResponse:
    """Output of one rank of the job's latest attempt from byte `offset` (on any node of
    a multi-node attempt), or with `rank=launcher` the launcher's own output of the
    latest server attempt (where a failure that never reached a rank says why). The
    header `X-Next-Offset` is where to continue and `X-Log-File` names the log; a
    follower (`argosy logs -f`) passes the name it read as `file`, and when a newer
    attempt's log has taken over since, it is read from its start."""
    row = _job(ctl, job_id)
    if not who.may_read_output(row["queue"]):
        raise HTTPException(403, f"a job's output is for queue '{row['queue']}' and admins")
    ranks = JobSpec.model_validate(row["spec"]).device_range[1]
    if rank != LAUNCHER and rank >= ranks:
        raise HTTPException(404, f"no rank {rank}: job {job_id} has ranks 0..{ranks - 1}")
    run_dir, attempts = ctl.run_dir(job_id), row["attempts"]
    path = launcher_log(run_dir, attempts) if rank == LAUNCHER else latest_rank_log(run_dir, rank)
    name = log_name(run_dir, path)
    return log_response(path, 0 if file is not None and file != name else offset, name)


def log_response(path: Path | None, offset: int, name: str = "") -> PlainTextResponse:
    """A log's text from byte `offset`; the header `X-Next-Offset` is where to continue,
    `X-Log-File` which log it is."""
    data = read_log_chunk(path, offset, LOG_CHUNK_BYTES)
    headers = {"X-Next-Offset": str(offset + len(data)), "X-Log-File": name}
    return PlainTextResponse(data.decode(errors="replace"), headers=headers)


@router.get("/events")
async def events(ctl: Ctl, who: Who, cursor: Cursor = 0, limit: Limit = 100) -> EventPage:
    rows, nxt = ctl.store.list_events(cursor=cursor, limit=limit)
    return EventPage(items=[event_view(r) for r in rows], next_cursor=nxt)


@router.get("/queues")
async def queues(ctl: Ctl, who: Who) -> list[QueueInfo]:
    """The queue tree with quota and use per chip type."""
    return queue_views(ctl.scheduling, ctl.store.count_jobs())


@router.get("/nodes")
async def nodes(ctl: Ctl, who: Who) -> list[NodeView]:
    return ctl.node_views()


@router.post("/nodes/{name}/cordon", responses={403: {}, 404: {}})
async def cordon(name: str, ctl: Ctl, who: Admin) -> NodeView:
    """Keep new work off a node; what runs there keeps running."""
    return _set_cordon(ctl, name, True, who.actor)


@router.post("/nodes/{name}/uncordon", responses={403: {}, 404: {}})
async def uncordon(name: str, ctl: Ctl, who: Admin) -> NodeView:
    return _set_cordon(ctl, name, False, who.actor)


@router.delete("/nodes/{name}", responses={403: {}, 404: {}, 409: {}})
async def forget_node(name: str, ctl: Ctl, who: Admin) -> NodeView:
    """Forget a lost node that nothing holds (gone for good); what it was is answered.
    409 while it is up or holds work."""
    views = ctl.node_views()
    try:
        ctl.forget_node(name, actor=who.actor)
    except NotFoundError as err:
        raise HTTPException(404, str(err)) from err
    except NodeBusyError as err:
        raise HTTPException(409, str(err)) from err
    return next(n for n in views if n.name == name)


def _job(ctl: Control, job_id: str) -> dict:
    try:
        return ctl.job(job_id)
    except NotFoundError as err:
        raise HTTPException(404, str(err)) from err


def _set_cordon(ctl: Control, name: str, cordoned: bool, actor: str) -> NodeView:
    try:
        ctl.set_cordon(name, cordoned, actor=actor)
    except NotFoundError as err:
        raise HTTPException(404, str(err)) from err
    views = ctl.node_views()
    return next(n for n in views if n.name == name)
