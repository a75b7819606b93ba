"""What the overview and queues pages show, computed from the live control plane:
devices by vendor and state, the five factors (each saying how it was computed, or that
argosy does not measure it here), and why each pending job at the head of a queue waits.

    chips = chips_by_vendor(ctl)                 # [ChipRow(vendor, chip, allocated, ...)]
    factors = five_factors(ctl, series)
"""

from __future__ import annotations

from dataclasses import dataclass

from argosy.core.errors import UnknownNameError
from argosy.hardware.catalog import default_catalog
from argosy.server.console.reads import Series, mean_effective_training_time, pending_jobs
from argosy.server.control import Control
from argosy.server.schemas import QueueInfo
from argosy.server.views import queue_views

PENDING_SHOWN = 20
"""Pending jobs listed per queue (the head of its line)."""


@dataclass(frozen=True)
class ChipRow:
    """Devices of one chip type, by state (each device in exactly one state)."""

    vendor: str
    chip: str
    allocated: int
    free: int
    cordoned: int
    down: int

    @property
    def total(self) -> int:
        return self.allocated + self.free + self.cordoned + self.down


def vendor_of(chip: str) -> str:
    try:
        return str(default_catalog().get(chip).vendor)
    except UnknownNameError:
        return "other"


def chips_by_vendor(ctl: Control) -> list[ChipRow]:
    """Allocated devices count as allocated even on a cordoned or lost node."""
    s = ctl.scheduling
    table: dict[str, list[int]] = {}
    for node in s.nodes:
        used = s.used_on(node.name)
        row = table.setdefault(node.chip, [0, 0, 0, 0])
        row[0] += used
        idle = node.devices - used
        if node.name in ctl.lost:
            row[3] += idle
        elif node.name in ctl.cordoned:
            row[2] += idle
        else:
            row[1] += idle
    rows = [ChipRow(vendor_of(chip), chip, *counts) for chip, counts in table.items()]
    return sorted(rows, key=lambda r: (r.vendor, r.chip))


@dataclass(frozen=True)
class Factor:
    """One of the five factors: its value (None: not measured here) and how."""

    name: str
    value: float | None
    how: str


def five_factors(ctl: Control, chips: list[ChipRow], series: Series) -> list[Factor]:
    ett, finished = mean_effective_training_time(ctl.store)
    total = sum(r.total for r in chips)
    held = sum(series.allocated) / len(series.allocated) if series.allocated else 0.0
    util = held / total if total else None
    return [
        Factor("energy efficiency", None, "1/PUE: a facility figure, not measured by argosy"),
        Factor(
            "single-chip efficiency",
            None,
            "MFU: jobs do not report it yet; `argosy plan` predicts it for a plan",
        ),
        Factor(
            "parallel scaling",
            None,
            "not measured on a live cluster; `argosy plan` predicts it for a plan",
        ),
        Factor(
            "effective training time",
            ett,
            f"mean productive / wall time of {finished} finished job(s), from their runtime "
            "summaries",
        ),
        Factor(
            "resource utilization",
            util,
            f"mean devices held by jobs over the chart's window / {total} devices owned "
            f"(now: {sum(r.allocated for r in chips)} held)",
        ),
    ]


@dataclass(frozen=True)
class QueueRow:
    """A queue with its borrowing and the head of its pending line."""

    info: QueueInfo
    borrowing: dict[str, int]
    waiting: list[tuple[str, str, str]]
    """(job id, name, why it waits) of the oldest pending jobs."""


def queue_rows(ctl: Control) -> list[QueueRow]:
    infos = queue_views(ctl.scheduling, ctl.store.count_jobs())
    free = {r.chip: r.free for r in chips_by_vendor(ctl)}
    out = []
    for q in infos:
        borrowing = {c: u - q.nominal.get(c, 0) for c, u in q.usage.items()}
        borrowing = {c: b for c, b in borrowing.items() if b > 0}
        waiting = []
        if q.leaf and q.pending:
            for row in pending_jobs(ctl.store, q.name, PENDING_SHOWN):
                waiting.append((row["id"], row["name"], wait_reason(row, q, free)))
        out.append(QueueRow(q, borrowing, waiting))
    return out


def wait_reason(row: dict, q: QueueInfo, free: dict[str, int]) -> str:
    """Why a pending job waits, from what the console can see: its stored reason (a
    requeue, a preemption), its queue's ceiling, the free devices, or its place in line."""
    spec = row["spec"]
    need = int(spec.get("nproc_per_node", 1)) * int(spec.get("nnodes", 1))
    chips = spec.get("chips") or list(q.ceiling)
    room = {c: q.ceiling.get(c, 0) - q.usage.get(c, 0) for c in chips}
    parts = []
    if row["reason"]:
        parts.append(row["reason"])
    if room and max(room.values()) < need:
        parts.append(
            f"queue '{q.name}' at its ceiling: needs {need}, room for {max(room.values())}"
        )
    elif max((free.get(c, 0) for c in chips), default=0) < need:
        parts.append(f"needs {need} devices; {max(free.get(c, 0) for c in chips)} free")
    else:
        parts.append("fits now: waits for the next scheduler cycle or for older jobs")
    return "; ".join(parts)
