"""The console's energy page: the fleet's metered energy over a window, per node, over time,
and the energy factor with its configured PUE (`server.energy`). Read-only; the page polls
its `/energy/live` fragment like the other pages.

    GET /energy?window_h=24      fleet energy, per node, average power over time, the factor
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from argosy.server.console.pages import WINDOWS_H, WindowH
from argosy.server.console.web import ConsoleError, ConsoleRoute, Ctl, Viewer, is_htmx, render

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
BUCKETS = 48


def energy_context(ctl: Ctl, window_h: int) -> dict:
    """The fleet's energy over the window, and its average power per time slice."""
    if window_h not in WINDOWS_H:
        known = ", ".join(map(str, WINDOWS_H))
        raise ConsoleError(f"window_h {window_h} is not offered; known: {known}", 422)
    fleet = ctl.energy.fleet(time.time(), window_h * 3600.0, BUCKETS)
    slices = fleet["series"]
    chart = {
        "t": [s["start_s"] for s in slices],
        "watts": [round(s["joules"] / (s["end_s"] - s["start_s"]), 3) for s in slices],
    }
    return {"fleet": fleet, "chart": chart, "window_h": window_h, "windows_h": WINDOWS_H}


@router.get("/energy", response_class=HTMLResponse)
async def energy(request: Request, who: Viewer, ctl: Ctl, window_h: WindowH = 24) -> HTMLResponse:
    template = "_energy.html" if is_htmx(request) else "energy.html"
    return render(request, template, who, **energy_context(ctl, window_h))
