"""The console's read-only pages. Each page has a `/live` fragment (or answers htmx with
its table only) that the page polls, so what it shows follows the cluster without a
reload. Every query is bounded: a page of jobs, the head of each queue, a time window.

    GET /            overview: devices by vendor and state, utilization over time, factors
    GET /queues      quota, use, borrowing and why the head of each line waits
    GET /jobs        filtered, paginated (newest first); GET /jobs/{id} its story and logs
    GET /services    inference services; GET /nodes  health and cordons
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from argosy.server.api import LAUNCHER, LogRank
from argosy.server.console.overview import (
    chips_by_vendor,
    five_factors,
    live_efficiency,
    pending_wait,
    queue_rows,
)
from argosy.server.console.reads import (
    JobFilter,
    allocation_series,
    job_page,
    ready_replicas,
    service_page,
)
from argosy.server.console.runlog import RunLogs
from argosy.server.console.timeline import job_story
from argosy.server.console.web import ConsoleError, ConsoleRoute, Ctl, Viewer, is_htmx, render
from argosy.server.control import NotFoundError
from argosy.server.energy import live_energy
from argosy.server.schemas import ACTIVE
from argosy.server.views import (
    latest_rank_log,
    launcher_log,
    log_name,
    read_log_chunk,
    service_view,
)

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
WINDOWS_H = (1, 6, 24, 168)
"""Chart windows the overview offers (hours)."""
BUCKETS = 72
SERVICE_WINDOW_S = 24 * 3600.0
LOG_CHUNK_BYTES = 64 << 10
States = ("", "pending", "admitted", "running", "succeeded", "failed", "cancelled")
Before = Annotated[int | None, Query(ge=0, le=2**62)]
PageSize = Annotated[int, Query(ge=5, le=200)]


WindowH = Annotated[int, Query(ge=1, le=168)]


async def run_logs(request: Request) -> RunLogs:
    """The app's digests of the runtime's event logs, kept across page views (made on
    first use)."""
    state = request.app.state
    if not hasattr(state, "run_logs"):
        state.run_logs = RunLogs()
    return state.run_logs


Logs = Annotated[RunLogs, Depends(run_logs)]


def overview_context(ctl: Ctl, window_h: int, logs: RunLogs) -> dict:
    if window_h not in WINDOWS_H:
        known = ", ".join(map(str, WINDOWS_H))
        raise ConsoleError(f"window_h {window_h} is not offered; known: {known}", 422)
    chips = chips_by_vendor(ctl)
    live = live_efficiency(ctl, logs)
    series = allocation_series(ctl.store, time.time(), window_h * 3600.0, BUCKETS, live)
    totals = {
        "allocated": sum(r.allocated for r in chips),
        "total": sum(r.total for r in chips),
    }
    chart = {"t": series.times_s, "allocated": series.allocated, "useful": series.useful}
    counts: dict[str, int] = {}
    for (_queue, state), n in ctl.store.count_jobs().items():
        counts[state] = counts.get(state, 0) + n
    factors = five_factors(ctl, chips, series, live, window_h * 3600.0)
    return {
        "chips": chips,
        "totals": totals,
        "chart": chart,
        "factors": factors,
        "counts": counts,
        "window_h": window_h,
        "windows_h": WINDOWS_H,
    }


@router.get("/", response_class=HTMLResponse)
async def overview(
    request: Request, who: Viewer, ctl: Ctl, logs: Logs, window_h: WindowH = 1
) -> HTMLResponse:
    return render(request, "overview.html", who, **overview_context(ctl, window_h, logs))


@router.get("/overview/live", response_class=HTMLResponse)
async def overview_live(
    request: Request, who: Viewer, ctl: Ctl, logs: Logs, window_h: WindowH = 1
) -> HTMLResponse:
    return render(request, "_overview.html", who, **overview_context(ctl, window_h, logs))


@router.get("/queues", response_class=HTMLResponse)
async def queues(request: Request, who: Viewer, ctl: Ctl) -> HTMLResponse:
    template = "_queues.html" if is_htmx(request) else "queues.html"
    return render(request, template, who, rows=queue_rows(ctl))


@router.get("/jobs", response_class=HTMLResponse)
async def jobs(
    request: Request,
    who: Viewer,
    ctl: Ctl,
    state: Annotated[str, Query(max_length=16)] = "",
    queue: Annotated[str, Query(max_length=100)] = "",
    name: Annotated[str, Query(max_length=100)] = "",
    before: Before = None,
    limit: PageSize = 50,
) -> HTMLResponse:
    if state not in States:
        raise ConsoleError(f"unknown state '{state}'; known: {', '.join(States[1:])}", 422)
    flt = JobFilter(state, queue, name)
    page = job_page(ctl.store, flt, before, limit)
    template = "_jobs_table.html" if is_htmx(request) else "jobs.html"
    leaves = ctl.scheduling.sched.tree.leaves
    return render(
        request, template, who, page=page, flt=flt, states=States, leaves=leaves, limit=limit
    )


def _job(ctl: Ctl, job_id: str) -> dict:
    try:
        return ctl.job(job_id)
    except NotFoundError as err:
        raise ConsoleError(str(err), 404) from err


def job_context(ctl: Ctl, job_id: str, logs: RunLogs) -> dict:
    row = _job(ctl, job_id)
    story = job_story(ctl, row, logs)
    chart = {"step": story.steps, "loss": story.losses}
    waiting = pending_wait(ctl, row) if row["state"] == "pending" else ""
    active = row["state"] in ACTIVE
    live_j = live_energy(ctl.run_dir(job_id)) if active else None
    return {
        "job": row,
        "story": story,
        "chart": chart,
        "active": active,
        "waiting": waiting,
        "live_energy": live_j,
    }


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(request: Request, job_id: str, who: Viewer, ctl: Ctl, logs: Logs) -> HTMLResponse:
    return render(request, "job.html", who, **job_context(ctl, job_id, logs))


@router.get("/jobs/{job_id}/live", response_class=HTMLResponse)
async def job_live(
    request: Request, job_id: str, who: Viewer, ctl: Ctl, logs: Logs
) -> HTMLResponse:
    return render(request, "_job_live.html", who, **job_context(ctl, job_id, logs))


@router.get("/jobs/{job_id}/log")
async def job_log(
    job_id: str,
    who: Viewer,
    ctl: Ctl,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    rank: LogRank = 0,
    file: Annotated[str, Query(max_length=300)] = "",
) -> JSONResponse:
    """New output of one rank of the latest attempt (or with `rank=launcher` of the
    launcher of the latest server attempt) from `offset` (the page polls it); when a
    newer attempt's log has appeared since `file`, it is read from its start."""
    row = _job(ctl, job_id)
    if not who.may_read_output(row["queue"]):
        raise ConsoleError(f"a job's output is for queue '{row['queue']}' and admins", 403)
    log, name = _log_of(ctl, row, rank)
    if log is not None and name != file:
        offset = 0
    data = read_log_chunk(log, offset, LOG_CHUNK_BYTES)
    text = data.decode(errors="replace")
    return JSONResponse({"text": text, "next": offset + len(data), "file": name})


def _log_of(ctl: Ctl, row: dict, rank: int | str) -> tuple[Path | None, str]:
    """The log the job page streams and the name that changes with each new attempt."""
    run_dir = ctl.run_dir(row["id"])
    attempts = row["attempts"]
    if rank == LAUNCHER:
        log = launcher_log(run_dir, attempts)
    else:
        log = latest_rank_log(run_dir, int(rank))
    return log, log_name(run_dir, log)


@router.get("/services", response_class=HTMLResponse)
async def services(request: Request, who: Viewer, ctl: Ctl, before: Before = None) -> HTMLResponse:
    rows, older = service_page(ctl.store, before, 50)
    views = [service_view(r) for r in rows]
    series = ready_replicas(ctl.store, [v.id for v in views], time.time(), SERVICE_WINDOW_S)
    chart = {"names": [v.name for v in views], "series": [series[v.id] for v in views]}
    template = "_services.html" if is_htmx(request) else "services.html"
    return render(request, template, who, services=views, older=older, chart=chart)


@router.get("/nodes", response_class=HTMLResponse)
async def nodes(request: Request, who: Viewer, ctl: Ctl) -> HTMLResponse:
    views = ctl.node_views()
    template = "_nodes.html" if is_htmx(request) else "nodes.html"
    return render(request, template, who, nodes=views)
