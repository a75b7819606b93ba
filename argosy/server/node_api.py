"""REST routes of one node: its detail with health history, and the health feed
(`POST /api/v1/nodes/{name}/health`, admin) that applies the node-record policy."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from argosy.server.api import COMMON, Admin, Ctl, Who
from argosy.server.control import Control, NotFoundError
from argosy.server.schemas import HealthEvidence, HealthReportBody, NodeDetail
from argosy.server.views import iso

router = APIRouter(prefix="/api/v1", responses=COMMON)


@router.get("/nodes/{name}", responses={404: {}})
async def node(name: str, ctl: Ctl, who: Who) -> NodeDetail:
    """The node, its health record and the latest 100 verdicts about it."""
    return _detail(ctl, name)


@router.post("/nodes/{name}/health", responses={403: {}, 404: {}})
async def report_health(name: str, body: HealthReportBody, ctl: Ctl, who: Admin) -> NodeDetail:
    """Report a verdict about a node; the node-record policy may cordon or quarantine it
    (it leaves placement) or return it to service (healthy checks, a repair)."""
    try:
        ctl.report_health(name, body.verdict, body.detail, actor=who.actor)
    except NotFoundError as err:
        raise HTTPException(404, str(err)) from err
    return _detail(ctl, name)


def _detail(ctl: Control, name: str) -> NodeDetail:
    views = ctl.node_views()
    view = next((v for v in views if v.name == name), None)
    if view is None:
        raise HTTPException(
            404, f"unknown node '{name}'; known: {', '.join(v.name for v in views)}"
        )
    record = ctl.health.record(name)
    history = [
        HealthEvidence(
            kind=r["kind"],
            detail=r["detail"],
            state=r["state"],
            created_at=iso(r["created_at"]) or "",
        )
        for r in ctl.health.history(name)
    ]
    return NodeDetail(
        **view.model_dump(),
        in_service=name not in ctl.scheduling.out_of_service,
        healthy_streak=record.healthy_streak,
        score=record.score(record.last_s, ctl.health.config) if record.marks else 0.0,
        history=history,
    )
