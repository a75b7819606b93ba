"""REST routes of energy: the fleet's (per node, over time, the energy factor with its
configured PUE) and one job's (per attempt and node, with its runtime figures). Any valid
token reads them, as it reads jobs and nodes.

    GET /api/v1/energy?window_h=24&buckets=24
    GET /api/v1/jobs/{job_id}/energy
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict

from argosy.server.api import COMMON, Ctl, Who
from argosy.server.control import NotFoundError
from argosy.server.energy import live_energy
from argosy.server.schemas import ACTIVE
from argosy.server.views import iso

router = APIRouter(prefix="/api/v1", responses=COMMON)


class EnergySums(BaseModel):
    """Joules metered (None: no measured attempt) and how many attempts, unmeasured rows."""

    model_config = ConfigDict(extra="forbid")

    total_j: float | None
    """IT joules the launchers metered (every device their meters read)."""
    productive_j: float | None
    """Of those, the joules of productive steps (goodput's buckets)."""
    attempts: int
    """Attempts with a row here."""
    unmeasured: int
    """Rows whose node metered nothing (not counted in the sums)."""


class NodeEnergy(EnergySums):
    node: str


class EnergySlice(BaseModel):
    start: str
    end: str
    joules: float


class FleetEnergy(EnergySums):
    """The fleet's energy over a window, and the energy factor."""

    window_h: float
    pue: float | None
    """The facility's PUE as configured (server config `pue`); never measured."""
    pue_source: str
    energy_factor: float | None
    """productive IT joules / (IT joules x PUE)."""
    how: str
    nodes: list[NodeEnergy]
    series: list[EnergySlice]


class AttemptEnergy(BaseModel):
    attempt: int
    node: str
    started_at: str | None
    ended_at: str | None
    total_j: float | None
    productive_j: float | None
    detail: str


class JobEnergy(EnergySums):
    """One job's energy: per attempt and node, and the last summary's runtime figures."""

    job_id: str
    rows: list[AttemptEnergy]
    runtime: dict[str, Any] | None
    """The latest attempt's summary `energy` section (joules per step, tokens per joule,
    watts per device, joules lost by cause), or None."""
    live: dict[str, Any] | None
    """A running job: joules its attempt's launcher (node rank 0) has metered so far
    (`seconds` since its launch, `total_j`, per device); else None."""


@router.get("/energy")
async def fleet_energy(
    ctl: Ctl,
    who: Who,
    window_h: Annotated[float, Query(ge=0.01, le=24 * 366)] = 24.0,
    buckets: Annotated[int, Query(ge=1, le=500)] = 24,
) -> FleetEnergy:
    """Energy of the attempts that ran in the last `window_h` hours."""
    data = ctl.energy.fleet(time.time(), window_h * 3600.0, buckets)
    series = [
        EnergySlice(start=iso(s["start_s"]) or "", end=iso(s["end_s"]) or "", joules=s["joules"])
        for s in data.pop("series")
    ]
    data.pop("window_s")
    return FleetEnergy(**data, window_h=window_h, series=series)


@router.get("/jobs/{job_id}/energy", responses={404: {}})
async def job_energy(job_id: str, ctl: Ctl, who: Who) -> JobEnergy:
    """The job's metered energy, per attempt and node."""
    try:
        row = ctl.job(job_id)
    except NotFoundError as err:
        raise HTTPException(404, str(err)) from err
    data = ctl.energy.job(job_id)
    rows = [
        AttemptEnergy(
            attempt=r["attempt"],
            node=r["node"],
            started_at=iso(r["started_at"]),
            ended_at=iso(r["ended_at"]),
            total_j=r["total_j"],
            productive_j=r["productive_j"],
            detail=r["detail"],
        )
        for r in data.pop("rows")
    ]
    runtime = (row.get("summary") or {}).get("energy")
    live = live_energy(ctl.run_dir(job_id)) if row["state"] in ACTIVE else None
    runtime = runtime if isinstance(runtime, dict) else None
    return JobEnergy(**data, rows=rows, runtime=runtime, live=live)
