"""What the overview and queues pages show, computed from the live control plane:
devices by vendor and state, the five factors (each saying how it was computed, or that
argosy does not measure it here; running jobs count with their goodput so far), and why
each pending job at the head of a queue waits (naming the cordoned nodes that hold back
the devices it needs).

    chips = chips_by_vendor(ctl)                 # [ChipRow(vendor, chip, allocated, ...)]
    live = live_efficiency(ctl, logs)            # {job id: effective training time so far}
    factors = five_factors(ctl, chips, series, live)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from argosy.core.errors import UnknownNameError
from argosy.hardware.catalog import default_catalog
from argosy.server.console.reads import Series, mean_effective_training_time, pending_jobs
from argosy.server.console.runlog import RunLogs
from argosy.server.console.timeline import live_goodput
from argosy.server.control import Control
from argosy.server.schemas import QueueInfo
from argosy.server.views import queue_views

PENDING_SHOWN = 20
"""Pending jobs listed per queue (the head of its line)."""
MAX_LIVE_JOBS = 200
"""Running jobs whose live goodput the overview reads (the oldest first)."""


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
    """Allocated devices count as allocated even on a cordoned or lost node; the idle
    devices of a node out of service (cordoned by hand or by the health policy) count as
    cordoned."""
    s = ctl.scheduling
    table: dict[str, list[int]] = {}
    for node in s.nodes:
        used = s.used_on(node.name)
        row = table.setdefault(node.chip, [0, 0, 0, 0])
        row[0] += used
        idle = node.devices - used
        if node.name in ctl.lost:
            row[3] += idle
        elif node.name in s.out_of_service:
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


def live_efficiency(ctl: Control, logs: RunLogs, limit: int = MAX_LIVE_JOBS) -> dict[str, float]:
    """Effective training time so far of the running jobs (the oldest `limit`), from the
    runtime's live events (`RunLogs` reads only what each log gained since last time)."""
    out = {}
    for row in ctl.store.jobs_in(["running"])[:limit]:
        goodput = live_goodput(ctl, row["id"], logs)
        value = (goodput or {}).get("effective_training_time")
        if isinstance(value, int | float) and (goodput or {}).get("wall_s"):
            out[row["id"]] = float(value)
    return out


def energy_factor(ctl: Control, window_s: float) -> Factor:
    """Productive IT energy / (IT energy x PUE) over the window (`server.energy`)."""
    fleet = ctl.energy.fleet(time.time(), window_s, 1)
    metered = f"{fleet['attempts']} attempt(s) in the window, {fleet['unmeasured']} node row(s) "
    how = f"{fleet['how']}; PUE {fleet['pue_source']}; {metered}not metered"
    return Factor("energy efficiency", fleet["energy_factor"], how)


def five_factors(
    ctl: Control,
    chips: list[ChipRow],
    series: Series,
    live: dict[str, float] | None = None,
    window_s: float = 3600.0,
) -> list[Factor]:
    ett, finished = mean_effective_training_time(ctl.store)
    live = live or {}
    if live:  # the finished jobs' mean and each running job's figure so far, weighted alike
        total = (ett or 0.0) * finished + sum(live.values())
        ett = total / (finished + len(live))
    total = sum(r.total for r in chips)
    held = sum(series.allocated) / len(series.allocated) if series.allocated else 0.0
    util = held / total if total else None
    return [
        energy_factor(ctl, window_s),
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
            f"summaries, and of {len(live)} running job(s) so far, from their live events",
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
    held = held_back(ctl)
    out = []
    for q in infos:
        borrowing = {c: u - q.nominal.get(c, 0) for c, u in q.usage.items()}
        borrowing = {c: b for c, b in borrowing.items() if b > 0}
        waiting = []
        if q.leaf and q.pending:
            for row in pending_jobs(ctl.store, q.name, PENDING_SHOWN):
                why = wait_reason(row, q, free, held, spread_reason(ctl, row))
                waiting.append((row["id"], row["name"], why))
        out.append(QueueRow(q, borrowing, waiting))
    return out


def pending_wait(ctl: Control, row: dict) -> str:
    """Why a pending job waits, as its queue's row on the queues page says it."""
    q = next((q for q in queue_views(ctl.scheduling, {}) if q.name == row["queue"]), None)
    if q is None:
        return ""
    free = {r.chip: r.free for r in chips_by_vendor(ctl)}
    return wait_reason(row, q, free, held_back(ctl), spread_reason(ctl, row))


def held_back(ctl: Control) -> dict[str, list[tuple[str, int]]]:
    """Per chip type, the nodes that are up but out of placement (cordoned by hand or by
    the health policy) with their idle devices: what a cordon keeps from pending jobs."""
    s = ctl.scheduling
    out: dict[str, list[tuple[str, int]]] = {}
    for node in s.nodes:
        if node.name in s.out_of_service and node.name not in ctl.lost:
            idle = node.devices - s.used_on(node.name)
            if idle > 0:
                out.setdefault(node.chip, []).append((node.name, idle))
    return out


def wait_reason(
    row: dict,
    q: QueueInfo,
    free: dict[str, int],
    held: dict[str, list[tuple[str, int]]] | None = None,
    spread: str = "",
) -> str:
    """Why a pending job waits, from what the console can see: its stored reason (a
    requeue, a preemption), its queue's ceiling, a cordon (the devices it needs are idle
    on cordoned nodes, named), the free devices, free devices on too few nodes of one
    group for its gang (`spread`: `spread_reason`), or its place in line."""
    spec = row["spec"]
    need = int(spec.get("nproc_per_node", 1)) * int(spec.get("nnodes", 1))
    chips = spec.get("chips") or list(q.ceiling)
    room = {c: q.ceiling.get(c, 0) - q.usage.get(c, 0) for c in chips}
    have = max((free.get(c, 0) for c in chips), default=0)
    parts = []
    if row["reason"]:
        parts.append(row["reason"])
    if room and max(room.values()) < need:
        parts.append(
            f"queue '{q.name}' at its ceiling: needs {need}, room for {max(room.values())}"
        )
    elif have < need:
        parts.append(_cordon_reason(need, chips, free, held or {}))
    elif spread:
        parts.append(spread)
    else:
        parts.append("fits now: waits for the next scheduler cycle or for older jobs")
    return "; ".join(parts)


def spread_reason(ctl: Control, row: dict) -> str:
    """Why a pending job with enough free devices in all still has no place ("" when it
    has one): its gang needs nodes of one group (one chip, one node size) with room on
    each, and the free devices are on too few such nodes; with each node's free devices
    and the nodes out of placement, named."""
    s = ctl.scheduling
    if s.fits_now(row["id"]) is not False:
        return ""
    spec = row["spec"]
    nnodes, per_node = int(spec.get("nnodes", 1)), int(spec.get("nproc_per_node", 1))
    chips = set(spec.get("chips") or [n.chip for n in s.nodes])
    free = [
        f"{n.name} {n.devices - s.used_on(n.name)} of {n.devices}"
        for n in s.nodes
        if n.chip in chips and n.name not in s.out_of_service
    ]
    out = [f"{n.name} ({_out_why(ctl, n.name)})"
           for n in s.nodes if n.chip in chips and n.name in s.out_of_service]  # fmt: skip
    gang = f"{nnodes} node(s) with {per_node} free device(s) each"
    return (
        f"no place now: needs {gang} in one node group (one chip, one node size); free: "
        + (", ".join(free) or "none")
        + (f"; out of placement: {', '.join(out)}" if out else "")
    )


def _out_why(ctl: Control, name: str) -> str:
    """Why a node is out of placement, and what brings it back."""
    if name in ctl.lost:
        return "lost"
    state = ctl.health.record(name).state
    if not state.in_service:
        return f"health: {state.value}; `argosy repair {name}` brings it back"
    return f"cordoned; `argosy cordon {name} --undo` brings it back"


def _cordon_reason(
    need: int, chips: list[str], free: dict[str, int], held: dict[str, list[tuple[str, int]]]
) -> str:
    """Too few free devices: named cordoned nodes when their idle devices would make up
    the difference for an accepted chip type, else the count."""
    have = max((free.get(c, 0) for c in chips), default=0)
    for chip in chips:
        nodes = held.get(chip, [])
        if nodes and free.get(chip, 0) + sum(idle for _, idle in nodes) >= need:
            names = ", ".join(f"{name} ({idle} idle)" for name, idle in nodes)
            plural = "s" if len(nodes) > 1 else ""
            return (
                f"node{plural} cordoned: {names}; needs {_devices(need)}, "
                f"{free.get(chip, 0)} free elsewhere"
            )
    return f"needs {_devices(need)}; {have} free"


def _devices(n: int) -> str:
    return f"{n} device" + ("" if n == 1 else "s")
