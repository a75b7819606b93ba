"""A job's story for its page: the server's events (submitted, admitted, attempt lost,
...) merged with the runtime's (`events.jsonl` in the run directory: spawns, faults,
restarts, resumes, checkpoints), the loss curve, and the goodput breakdown.

    story = job_story(ctl, row, logs)   # logs: RunLogs, kept across page views
    story.items      # [Item(at="14:03:30.234", source="runtime", kind="fault", text=...)]

The runtime's log is read through `RunLog`, which reads only what was appended since
the last view and keeps a digest of bounded size, so a long run's page stays cheap. The
goodput of a job that has not ended is the runtime's own accounting over its events so
far (the final summary replaces it when the job ends).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from argosy.runtime.events import EVENTS_FILE
from argosy.server.console.runlog import RunLogs
from argosy.server.control import Control
from argosy.server.store import Row

RUNTIME_KINDS = {
    "start": "launched",
    "spawn": "ranks spawned",
    "attached": "ranks attached",
    "resume": "resumed",
    "fault": "fault",
    "restart": "restart",
    "give_up": "gave up",
    "checkpoint": "checkpoint",
    "commit": "checkpoint committed",
    "stopped": "group stopped",
    "end": "ended",
}


@dataclass(frozen=True)
class Item:
    """One line of the timeline."""

    at_s: float
    source: str
    kind: str
    text: str

    @property
    def clock(self) -> str:
        return datetime.fromtimestamp(self.at_s, UTC).strftime("%H:%M:%S.%f")[:-3]


@dataclass
class Story:
    items: list[Item] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    last_step: int = 0
    goodput: dict[str, Any] | None = None


def job_story(ctl: Control, row: Row, logs: RunLogs) -> Story:
    rows, _ = ctl.store.list_events(job_id=row["id"], limit=500)
    story = Story([Item(e["created_at"], _source(e), e["kind"], e["message"]) for e in rows])
    log = logs.get(row["id"], ctl.run_dir(row["id"]) / EVENTS_FILE)
    story.items.extend(_runtime_item(e) for e in log.events if e["event"] in RUNTIME_KINDS)
    story.items.sort(key=lambda i: i.at_s)
    story.steps = [step for step, _ in log.curve]
    story.losses = [loss for _, loss in log.curve]
    story.last_step = log.last_step
    story.goodput = row["summary"] if _is_final(row["summary"]) else log.goodput()
    return story


def live_goodput(ctl: Control, job_id: str, logs: RunLogs) -> dict[str, Any] | None:
    """The runtime's accounting so far of a job that has not ended (None before its
    first event)."""
    return logs.get(job_id, ctl.run_dir(job_id) / EVENTS_FILE).goodput()


def _source(event: Row) -> str:
    """`server` for the control loop's own events, else who asked (`admin`, a token)."""
    actor = event.get("actor") or "system"
    return "server" if actor == "system" else actor


def _runtime_item(e: dict[str, Any]) -> Item:
    return Item(_wall_s(e.get("wall")), "runtime", e["event"], _describe(e))


def _describe(e: dict[str, Any]) -> str:
    kind, attempt = e["event"], e.get("attempt")
    label = RUNTIME_KINDS[kind]
    if kind == "fault":
        injected = " (injected)" if e.get("injected_at_s") else ""
        return f"{e.get('kind', 'fault')}{injected}: {e.get('detail', '')}; {e.get('action', '')}"
    if kind == "resume":
        return f"attempt {attempt} resumed at step {e.get('step', 0)}"
    if kind in ("checkpoint", "commit"):
        return f"{label} at step {e.get('step', '?')}"
    if kind == "restart":
        return f"restart into attempt {attempt} ({e.get('reason', '')})"
    return f"{label}" + (f" (attempt {attempt})" if attempt is not None else "")


def _wall_s(wall: Any) -> float:
    try:
        return datetime.fromisoformat(str(wall)).timestamp()
    except ValueError:
        return 0.0


def _is_final(summary: Any) -> bool:
    return isinstance(summary, dict) and "effective_training_time" in summary
