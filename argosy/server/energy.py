"""Energy in the control plane: what each attempt's launchers metered, per job, per node,
over time, and the energy factor.

When an attempt ends, its kept summary (`summaries.settle_summary`) carries the energy
section node rank 0's launcher wrote (`runtime.energy`), and for a multi-node attempt one
row per node rank with that node's joules. `EnergyLedger.record_attempt` stores one row
per node: total joules (None where no meter read there, with the reason), productive
joules, and when it ran (the attempt's end minus its wall time). Reads:

- `job(job_id)`: the job's rows and sums; `live_energy(run_dir)`: what a running
  attempt's launcher has logged so far;
- `fleet(now_s, window_s, buckets)`: sums over attempts that ended in the window, per node,
  and over time (each row's joules spread evenly over the time it ran), and the
  energy factor = productive (useful-work) IT joules / (IT joules x PUE), where PUE is the
  facility figure configured in `ServerConfig.pue`: shown as configured, never measured.
  Without one the factor is over IT energy alone and says so.

Only measured rows enter the sums; `unmeasured` counts the others. The figures are the
job's word: the control plane records them bounded by what the placement can draw
(`energy_bounds`); a row past that is kept unmeasured, saying what it claimed.

    ledger = EnergyLedger(store.engine, pue=1.2)
    ledger.record_attempt("j1", 1, ["n0"], summary, ended_s=time.time())
    ledger.fleet(time.time(), 24 * 3600.0, 24)["energy_factor"]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from argosy.core.confined import read_job_file, stat_job_file
from argosy.runtime.energy import ENERGY_FILE
from argosy.server.energy_bounds import bound_rows
from argosy.server.job_json import clip_text, loads_job_json, number
from argosy.server.tables import energy

TAIL_BYTES = 64 << 10
"""How much of a running attempt's energy log `live_energy` reads: its end only."""

Row = dict[str, Any]


class EnergyLedger:
    """The energy rows of the store, written at attempt ends, read per job, node, window."""

    def __init__(self, engine: Engine, pue: float | None = None) -> None:
        self.engine = engine
        self.pue = pue

    def record_attempt(
        self,
        job_id: str,
        attempt: int,
        nodes: list[str],
        summary: Row,
        ended_s: float,
        *,
        started_s: float | None = None,
        ceilings_w: dict[str, float] | None = None,
    ) -> list[Row]:
        """Store (and return) the attempt's rows, one per node it ran on; with the
        server's `started_s`, bounded by what each node can draw (`energy_bounds`:
        `ceilings_w`, watts per node)."""
        rows = attempt_rows(job_id, attempt, nodes, summary, ended_s)
        if started_s is not None:
            rows = bound_rows(
                rows, started_s=started_s, ended_s=ended_s, ceilings_w=ceilings_w or {}
            )
        if rows:
            with self.engine.begin() as c:
                c.execute(energy.insert(), rows)
        return rows

    def job(self, job_id: str) -> Row:
        """The job's rows (oldest first) and their sums."""
        query = select(energy).where(energy.c.job_id == job_id).order_by(energy.c.seq)
        with self.engine.connect() as c:
            rows = [dict(r) for r in c.execute(query).mappings()]
        return {"job_id": job_id, **_sums(rows), "rows": rows}

    def fleet(self, now_s: float, window_s: float, buckets: int) -> Row:
        """Energy of the attempts that ran in the last `window_s`: sums, per node, over
        time in `buckets` equal slices, and the energy factor with its PUE."""
        since = now_s - window_s
        query = select(energy).where(energy.c.ended_at >= since, energy.c.started_at <= now_s)
        with self.engine.connect() as c:
            rows = [dict(r) for r in c.execute(query).mappings()]
        per_node: dict[str, list[Row]] = {}
        for row in rows:
            per_node.setdefault(row["node"], []).append(row)
        sums = _sums(rows)
        return {
            **sums,
            **self.factor(sums["productive_j"], sums["total_j"]),
            "window_s": window_s,
            "nodes": [{"node": n, **_sums(r)} for n, r in sorted(per_node.items())],
            "series": spread(rows, since, now_s, buckets),
        }

    def factor(self, productive_j: float | None, total_j: float | None) -> Row:
        """The energy factor and how it was computed (PUE as configured)."""
        pue = self.pue if self.pue is not None else 1.0
        source = (
            f"configured (server config pue = {self.pue:g}), not measured"
            if self.pue is not None
            else "not configured: the factor is over IT energy only (set server config pue)"
        )
        value = None
        if total_j and productive_j is not None:
            value = round(productive_j / (total_j * pue), 4)
        return {
            "pue": self.pue,
            "pue_source": source,
            "energy_factor": value,
            "how": "IT joules of productive steps (goodput's buckets) / (IT joules metered x "
            "PUE), over the attempts whose launchers metered energy",
        }


def live_energy(run_dir: Path) -> Row | None:
    """What a running attempt's launcher (node rank 0) has logged so far: the last line of
    its `energy.jsonl` (the job writes it: read confined, the tail only), or None when it
    has logged no sample (no meter reads there, or it has not started)."""
    path = run_dir / ENERGY_FILE
    st = stat_job_file(path)
    if st is None:
        return None
    offset = max(0, st.st_size - TAIL_BYTES)
    data = read_job_file(path, limit=TAIL_BYTES, offset=offset) or b""
    for line in reversed(data.decode(errors="replace").splitlines()):
        try:
            record = loads_job_json(line)
            joules = {str(d)[:64]: float(v[0]) for d, v in record["d"].items()}
            since = float(record["t"])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            continue  # the header, a torn line, or one the job garbled
        return {"seconds": since, "total_j": round(sum(joules.values()), 3), "devices": joules}
    return None


def attempt_rows(
    job_id: str, attempt: int, nodes: list[str], summary: Row, ended_s: float
) -> list[Row]:
    """One row per node of an attempt's kept summary (node rank 0 from the summary, the
    others from its `nodes` rows); a summary without energy (missing, from before the
    meter) gives a not-measured row with the reason."""
    per_node = summary.get("nodes")  # the server's rows (summaries.settle_summary)
    if isinstance(per_node, list) and per_node and all(isinstance(r, dict) for r in per_node):
        sources = [(r.get("node") or f"node-rank{i}", r) for i, r in enumerate(per_node)]
    else:
        sources = [(nodes[0] if nodes else "local", _node_figures(summary))]
    rows = []
    for node, figures in sources:
        wall = number(figures.get("wall_s"), low=0)
        started = ended_s - wall if wall else ended_s
        rows.append(
            {
                "job_id": job_id,
                "attempt": attempt,
                "node": str(node),
                "started_at": started,
                "ended_at": ended_s,
                "total_j": _number(figures.get("energy_j")),
                "productive_j": _number(figures.get("productive_j")),
                "detail": str(figures.get("energy_detail") or "")[:1000],
            }
        )
    return rows


def node_energy(summary: Row) -> Row:
    """A node's energy figures for its row of a multi-node summary (`summaries._node_row`)."""
    return _node_figures(summary)


def _node_figures(summary: Row) -> Row:
    """A node's figures from what its launcher wrote (the job's file: every value is
    checked for its type, numbers for being finite and not negative)."""
    section = summary.get("energy")
    wall = number(summary.get("wall_s"), low=0)
    if not isinstance(section, dict):
        why = summary.get("detail") if summary.get("status") == "missing" else None
        return {
            "wall_s": wall,
            "energy_detail": clip_text(why or "the run reported no energy", 500),
        }
    if not section.get("measured"):
        why = clip_text(section.get("reason", ""), 500)
        return {"wall_s": wall, "energy_detail": f"not measured: {why}"}
    devices = section.get("devices")
    devices = devices if isinstance(devices, dict) else {}
    methods = sorted({clip_text(d.get("method", "?"), 40) if isinstance(d, dict) else "?"
                      for d in devices.values()})  # fmt: skip
    return {
        "wall_s": wall,
        "energy_j": _number(section.get("total_j")),
        "productive_j": _number(section.get("productive_j")),
        "energy_detail": f"{len(devices)} device(s): {', '.join(methods[:8])}",
    }


def _number(value: Any) -> float | None:
    found = number(value, low=0)
    return None if found is None else float(found)


def _sums(rows: list[Row]) -> Row:
    measured = [r for r in rows if r["total_j"] is not None]
    total = sum(r["total_j"] for r in measured) if measured else None
    productive = sum(r["productive_j"] or 0.0 for r in measured) if measured else None
    return {
        "total_j": None if total is None else round(total, 3),
        "productive_j": None if productive is None else round(productive, 3),
        "attempts": len({(r["job_id"], r["attempt"]) for r in rows}),
        "unmeasured": len(rows) - len(measured),
    }


def spread(rows: list[Row], start_s: float, end_s: float, buckets: int) -> list[Row]:
    """Joules per time slice: each measured row's joules spread evenly over the time it
    ran (all at its end when it ran no time)."""
    if buckets < 1 or end_s <= start_s:
        raise ValueError(f"need buckets >= 1 and end > start, got {buckets}, {start_s}..{end_s}")
    width = (end_s - start_s) / buckets
    joules = [0.0] * buckets
    for row in rows:
        if row["total_j"] is None:
            continue
        a, b = row["started_at"], row["ended_at"]
        for k in range(buckets):
            lo, hi = start_s + k * width, start_s + (k + 1) * width
            if b > a:
                joules[k] += row["total_j"] * max(0.0, min(b, hi) - max(a, lo)) / (b - a)
            elif lo <= b < hi or (k == buckets - 1 and b == hi):
                joules[k] += row["total_j"]
    return [
        {"start_s": start_s + k * width, "end_s": start_s + (k + 1) * width, "joules": round(j, 3)}
        for k, j in enumerate(joules)
    ]
