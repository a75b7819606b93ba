"""The most joules an attempt's placement can draw: the ceiling a job's reported energy
must stay under to be counted.

The joules in an attempt's summary are the tenant's word: its launcher, running as the
job's user, writes them, and a job can write the file itself. A broken or hostile job
could claim a figure that swamps the fleet's sums, or productive joules above its total
to lift the energy factor. The server knows where the attempt ran (its placement) and
when (its own start stamp and the exit), and the catalog each chip's board power, so:

- a node's joules are at most `(devices x TDP x TDP_MARGIN + HOST_ALLOWANCE_W) x the
  attempt's wall time by the server's clock`;
- productive joules are at most the total;
- a row's start is never before the server started the attempt.

A row past either bound is kept, as not measured, naming what it claimed and the
ceiling: it enters no sum. What stays out of reach: a job that reports *less* than it
drew (no meter of the server's own reads the devices).

    ceilings = node_ceilings_w({"chip": "h100", "nodes": {"n0": 8}})   # {"n0": 7720.0}
    rows = bound_rows(rows, started_s=t0, ended_s=t1, ceilings_w=ceilings)
"""

from __future__ import annotations

from typing import Any

from argosy.core.errors import UnknownNameError
from argosy.hardware.catalog import default_catalog

TDP_MARGIN = 1.2
"""Boards draw above their rated power for short spells (boost, transients)."""
HOST_ALLOWANCE_W = 1000.0
"""What a node's host may add beside its accelerators when the launcher also meters the
CPU packages (RAPL): two server CPUs and their memory. A CPU-only node's "devices" are
its slots, each counted at the socket's power, so its ceiling is loose, not tight."""
SLACK_J = 1.0
"""Rounding in the figures a launcher writes."""

Row = dict[str, Any]


def node_ceilings_w(placement: Row | None) -> dict[str, float]:
    """The most watts each node of the placement can draw; {} where the placement or its
    chip is unknown (nothing is bounded then)."""
    if not placement or not isinstance(placement.get("nodes"), dict):
        return {}
    try:
        tdp = default_catalog().get(str(placement.get("chip", ""))).tdp_w
    except UnknownNameError:
        return {}
    return {
        str(node): devices * tdp * TDP_MARGIN + HOST_ALLOWANCE_W
        for node, devices in placement["nodes"].items()
    }


def bound_rows(
    rows: list[Row], *, started_s: float, ended_s: float, ceilings_w: dict[str, float]
) -> list[Row]:
    """The rows with each start no earlier than `started_s`, and each row whose joules
    are past what its node can draw in the attempt's time, or whose productive joules
    are past its total, turned into a not-measured row saying so."""
    window_s = max(0.0, ended_s - started_s)
    out = []
    for row in rows:
        row = row | {"started_at": min(max(row["started_at"], started_s), row["ended_at"])}
        why = _implausible(row, window_s, ceilings_w.get(row["node"]))
        if why:
            row |= {"total_j": None, "productive_j": None, "detail": why}
        out.append(row)
    return out


def _implausible(row: Row, window_s: float, ceiling_w: float | None) -> str:
    """Why the row's joules cannot be true ("" where they can)."""
    total, productive = row["total_j"], row["productive_j"]
    if total is None:
        return ""
    claimed = f"reported {total:.6g} J ({productive or 0:.6g} J productive)"
    if ceiling_w is not None and total > ceiling_w * window_s + SLACK_J:
        most = ceiling_w * window_s
        return (
            f"not counted: {claimed}, but its placement on {row['node']} can draw at most"
            f" {most:.6g} J in the {window_s:.1f} s the attempt ran"
        )
    if productive is not None and productive > total + SLACK_J:
        return f"not counted: {claimed}: more productive joules than joules"
    return ""
