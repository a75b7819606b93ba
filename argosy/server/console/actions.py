"""The console's forms: log in and out, submit and cancel jobs, cordon and uncordon
nodes (and forget a lost one), and store simulator reports. Each checks the session's
token exactly as the REST API does: a queue token submits and cancels only in its queue;
node actions need admin; a
queue token overwrites only the simulator reports its own queue uploaded.

    POST /login  token=...       -> a new session; its id in the cookie (HttpOnly,
                                    SameSite=Strict, Secure on https), redirect to `next`
    POST /logout                 -> the session is deleted: its cookie no longer works
    POST /submit yaml=... | name=...&script=...
    POST /jobs/{id}/cancel, /nodes/{name}/cordon, .../uncordon, .../forget, /sim

Every POST but /login carries the session's CSRF token (`web.viewer` checks it); /login,
which has no session yet, relies on the same-origin guard (`argosy.server.guards`).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Annotated

from fastapi import APIRouter, Form, Request, UploadFile
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from argosy.core.documents import load_yaml, validate
from argosy.core.errors import ConfigError
from argosy.server.admission import refuse_unless_runnable
from argosy.server.auth import Principal
from argosy.server.console.simreports import (
    MAX_REPORT_BYTES,
    Owner,
    ReportError,
    backfill_rows,
    idle_rows,
    list_reports,
    load_report,
    report_owner,
    save_report,
)
from argosy.server.console.web import (
    COOKIE,
    ConsoleError,
    ConsoleRoute,
    Ctl,
    Viewer,
    check_csrf,
    current_session,
    is_htmx,
    render,
)
from argosy.server.control import Control, NotFoundError
from argosy.server.node_control import NodeBusyError
from argosy.server.rate_limits import refuse_if_too_fast
from argosy.server.spec import JobSpec

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
SIM_DIR = "sim-reports"
Text = Annotated[str, Form(max_length=100_000)]


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str = "/") -> HTMLResponse:  # noqa: A002
    return render(request, "login.html", None, next=_safe_next(next))


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=200)],
    next: Text = "/",  # noqa: A002
) -> Response:
    who = request.app.state.tokens.principal(token.strip())
    if who is None:
        return render(
            request, "login.html", None, 401, next=_safe_next(next), error="unknown token"
        )
    request.state.actor = who.actor  # the access log's actor
    # a login writes a session row: a change of the token's, counted as any other
    refuse_if_too_fast(request, who)
    sessions = request.app.state.sessions
    sessions.close(request.cookies.get(COOKIE, ""))  # this browser's older session
    session_id, session = sessions.open(who)
    response = RedirectResponse(_safe_next(next), status_code=303)
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=max(1, int(sessions.ttl_s)),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session (with its CSRF token); a dead session just loses its cookie."""
    session = current_session(request)
    if session is not None:
        await check_csrf(request, session)
        request.app.state.sessions.close(request.cookies.get(COOKIE, ""))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


def _safe_next(target: str) -> str:
    """Only paths on this server (no `//host` or scheme): no open redirect."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


def _job_from_yaml(text: str) -> JobSpec:
    return validate(JobSpec, load_yaml(text, source="job YAML"))


@router.get("/submit", response_class=HTMLResponse)
async def submit_form(request: Request, who: Viewer, ctl: Ctl) -> HTMLResponse:
    leaves = _queues_for(who, ctl)
    return render(request, "submit.html", who, leaves=leaves, workdir="")  # not the server's cwd


@router.post("/submit")
async def submit(
    request: Request,
    who: Viewer,
    ctl: Ctl,
    yaml: Text = "",
    name: Text = "",
    queue: Text = "default",
    script: Text = "",
    args: Text = "",
    nproc_per_node: Annotated[int, Form(ge=1, le=1024)] = 1,
    workdir: Text = "",
) -> Response:
    """A job from YAML text or from the fields; errors name the line and field."""
    if yaml.strip():  # up to 100,000 values take seconds: parsed off the event loop
        spec = await run_in_threadpool(_job_from_yaml, yaml)
    else:
        fields = {"name": name, "queue": queue, "script": script, "args": args.split()}
        spec = validate(JobSpec, load_yaml(json.dumps(fields), source="form"))
        spec = spec.model_copy(update={"nproc_per_node": nproc_per_node})
    spec = _with_workdir(spec, workdir or spec.workdir or "")
    if not who.may_change(spec.queue):
        raise ConsoleError(f"this token may submit only to queue '{who.queue}'", 403)
    # the API's 422, shown on the form
    refuse_unless_runnable(spec, ctl.readable, ctl.job_user(spec.queue))
    digest = hashlib.sha256(json.dumps(spec.model_dump(), sort_keys=True).encode()).hexdigest()
    row, _ = ctl.submit(spec, None, digest, actor=who.actor)
    return _go(request, f"/jobs/{row['id']}")


def _with_workdir(spec: JobSpec, workdir: str) -> JobSpec:
    """`spec` in `workdir` (absolute), its script as given: a relative one resolves
    against the workdir when the job starts. Nothing is looked up here, as the server's
    user: admission looks as the job's user does, so that the answer tells no one what
    lies where that user cannot look (as the API does)."""
    if not workdir:
        raise ConfigError("give the job's working directory on the server", field="workdir")
    if not os.path.isabs(workdir):
        raise ConfigError("must be an absolute path on the server", field="workdir")
    return spec.model_copy(update={"workdir": workdir})


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: str, who: Viewer, ctl: Ctl) -> Response:
    row = _job(ctl, job_id)
    if not who.may_change(row["queue"]):
        raise ConsoleError(f"this token may cancel only in queue '{who.queue}'", 403)
    ctl.cancel(job_id, actor=who.actor)
    return _go(request, f"/jobs/{job_id}")


NODE_ACTIONS = ("cordon", "uncordon", "forget")


@router.post("/nodes/{name}/{action}", response_class=HTMLResponse)
async def node_action(request: Request, name: str, action: str, who: Viewer, ctl: Ctl) -> Response:
    """Cordon, uncordon, or forget a lost node gone for good (admin)."""
    if action not in NODE_ACTIONS:
        raise ConsoleError(f"unknown action '{action}'; known: {', '.join(NODE_ACTIONS)}", 404)
    if not who.is_admin:
        raise ConsoleError(f"to {action} a node needs an admin token", 403)
    try:
        if action == "forget":
            ctl.forget_node(name, actor=who.actor)
        else:
            ctl.set_cordon(name, action == "cordon", actor=who.actor)
    except NotFoundError as err:
        raise ConsoleError(str(err), 404) from err
    except NodeBusyError as err:
        raise ConsoleError(str(err), 409) from err
    if is_htmx(request):
        views = ctl.node_views()
        return render(request, "_nodes.html", who, nodes=views)
    return RedirectResponse("/nodes", status_code=303)


@router.get("/sim", response_class=HTMLResponse)
async def sim_reports(request: Request, who: Viewer, ctl: Ctl) -> HTMLResponse:
    folder = ctl.config.home / SIM_DIR
    return render(request, "sim.html", who, reports=list_reports(folder), folder=folder)


@router.post("/sim")
async def sim_upload(request: Request, who: Viewer, ctl: Ctl, report: UploadFile) -> Response:
    """Store a report: a new name, or one this principal may overwrite. The name is the
    file's as sent: one with a folder in it (`../x.json`) is refused, not shortened."""
    name = report.filename or ""
    raw = await report.read(MAX_REPORT_BYTES + 1)
    folder = ctl.config.home / SIM_DIR
    try:
        _check_may_overwrite(who, name, report_owner(folder, name))
        save_report(folder, name, raw, Owner(who.queue, who.actor))
    except ReportError as err:
        raise ConsoleError(f"{name or 'upload'}: {err}", 422) from err
    return _go(request, f"/sim/{name}")


def _check_may_overwrite(who: Principal, name: str, owner: Owner | None) -> None:
    """An admin overwrites any report; a queue token only its own queue's."""
    if owner is None or who.is_admin or (owner.queue is not None and owner.queue == who.queue):
        return
    whose = "an admin" if owner.queue is None else f"queue '{owner.queue}'"
    raise ConsoleError(
        f"report '{name}' was uploaded by {whose}; this token may overwrite only its own "
        f"queue's reports (an admin may overwrite any); upload it under another name",
        403,
    )


@router.get("/sim/{name}", response_class=HTMLResponse)
async def sim_report(request: Request, name: str, who: Viewer, ctl: Ctl) -> HTMLResponse:
    try:
        report = load_report(ctl.config.home / SIM_DIR, name)
    except ReportError as err:
        raise ConsoleError(str(err), 404) from err
    return render(request, "sim_report.html", who, report=report, chart=report.chart_data(),
                  idle=idle_rows(report.runs),
                  backfill=backfill_rows(report.runs))  # fmt: skip


def _job(ctl: Control, job_id: str) -> dict:
    try:
        return ctl.job(job_id)
    except NotFoundError as err:
        raise ConsoleError(str(err), 404) from err


def _queues_for(who: Principal, ctl: Control) -> list[str]:
    leaves = list(ctl.scheduling.sched.tree.leaves)
    return leaves if who.is_admin else [q for q in leaves if q == who.queue]


def _go(request: Request, target: str) -> Response:
    """After a change: htmx follows `HX-Redirect`; a plain form gets a 303."""
    if is_htmx(request):
        return Response(status_code=204, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)
