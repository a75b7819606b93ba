"""REST routes of services under /api/v1/services: create from a service spec, list, get,
delete, events, replica logs and the API key. The same tokens as jobs: any token reads
states; an admin or the queue's token creates, deletes and reads logs and the key (403
otherwise)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import PlainTextResponse

from argosy.core.errors import ArgosyError
from argosy.server.api import COMMON, Ctl, Cursor, Limit, Who, log_response
from argosy.server.control import Control, NotFoundError
from argosy.server.field_errors import field_errors
from argosy.server.queue_limits import QueueFullError
from argosy.server.schemas import EventPage, Service, ServicePage, ServiceState
from argosy.server.service_spec import ServiceSpec
from argosy.server.services import replica_key
from argosy.server.store import Row
from argosy.server.views import event_view, service_view

router = APIRouter(prefix="/api/v1", responses=COMMON)


@router.post("/services", status_code=201, responses={403: {}, 422: {}, 429: {}})
async def create_service(spec: ServiceSpec, ctl: Ctl, who: Who) -> Service:
    """Create a service: its replicas are placed by the scheduler and started as
    `argosy serve` processes (429 past `max_services_per_queue` services in its queue)."""
    if not who.may_change(spec.queue):
        raise HTTPException(403, f"this token may create services only in queue '{who.queue}'")
    try:
        row = ctl.submit_service(spec, actor=who.actor)
    except QueueFullError as err:
        raise HTTPException(429, str(err)) from None
    except ArgosyError as err:
        raise HTTPException(422, field_errors(err)) from err
    return service_view(row)


@router.get("/services")
async def list_services(
    ctl: Ctl,
    who: Who,
    state: Annotated[list[ServiceState] | None, Query()] = None,
    queue: Annotated[str | None, Query(max_length=100)] = None,
    cursor: Cursor = 0,
    limit: Limit = 100,
) -> ServicePage:
    """Services in creation order, filtered by state (repeatable) and queue."""
    rows, nxt = ctl.store.list_services(states=state or (), queue=queue, cursor=cursor, limit=limit)
    return ServicePage(items=[service_view(r) for r in rows], next_cursor=nxt)


@router.get("/services/{service_id}", responses={404: {}})
async def get_service(service_id: str, ctl: Ctl, who: Who) -> Service:
    return service_view(_service(ctl, service_id))


@router.delete("/services/{service_id}", responses={403: {}, 404: {}})
async def delete_service(service_id: str, ctl: Ctl, who: Who) -> Service:
    """Stop the replicas and free their devices (`stopping`, then `deleted`)."""
    row = _service(ctl, service_id)
    if not who.may_change(row["queue"]):
        raise HTTPException(403, f"this token may delete only in queue '{who.queue}'")
    return service_view(ctl.delete_service(service_id, actor=who.actor))


@router.get("/services/{service_id}/events", responses={404: {}})
async def service_events(
    service_id: str, ctl: Ctl, who: Who, cursor: Cursor = 0, limit: Limit = 100
) -> EventPage:
    _service(ctl, service_id)
    rows, nxt = ctl.store.list_events(job_id=service_id, cursor=cursor, limit=limit)
    return EventPage(items=[event_view(r) for r in rows], next_cursor=nxt)


@router.get(
    "/services/{service_id}/logs",
    response_class=PlainTextResponse,
    responses={403: {}, 404: {}},
)
async def service_logs(
    service_id: str,
    ctl: Ctl,
    who: Who,
    replica: Annotated[int, Query(ge=0, le=256)] = 0,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> PlainTextResponse:
    """Output of one replica's latest attempt from byte `offset` (header `X-Next-Offset`)."""
    row = _service(ctl, service_id)
    if not who.may_read_output(row["queue"]):
        raise HTTPException(403, f"a service's output is for queue '{row['queue']}' and admins")
    attempt = next((r["attempt"] for r in row["replicas"] if r["index"] == replica), 0)
    key = replica_key(service_id, replica)
    path = ctl.services.run_dir(key) / "server" / f"attempt{attempt}" / "output.log"
    return log_response(path if attempt else None, offset)


@router.get("/services/{service_id}/key", responses={403: {}, 404: {}})
async def service_key(service_id: str, ctl: Ctl, who: Who) -> dict[str, str]:
    """The service's API key: its replicas' `/v1/*` routes need it as
    `Authorization: Bearer <key>` (the `openai` SDK's `api_key`). Its queue and admins
    only: another tenant must not use (or drain) this service's model."""
    row = _service(ctl, service_id)
    if not who.may_read_output(row["queue"]):
        raise HTTPException(403, f"a service's key is for queue '{row['queue']}' and admins")
    return {"api_key": ctl.lease.api_key(service_id)}


def _service(ctl: Control, service_id: str) -> Row:
    try:
        return ctl.service(service_id)
    except NotFoundError as err:
        raise HTTPException(404, str(err)) from err
