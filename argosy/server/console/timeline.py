"""A job's story for its page: the server's events (submitted, admitted, attempt lost,
...) merged with the runtime's (`events.jsonl` in the run directory: spawns, faults,
restarts, resumes, checkpoints), the loss curve, and the goodput breakdown.

    story = job_story(ctl, row)
    story.items      # [Item(at="14:03:30.234", source="runtime", kind="fault", text=...)]

Step lines are not parsed as JSON unless they are needed for the loss curve (one point
every `len/200` steps), so a long run's page stays cheap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from argosy.core.confined import read_job_text, stat_job_file
from argosy.runtime.events import EVENTS_FILE
from argosy.runtime.goodput import summarize
from argosy.server.control import Control
from argosy.server.store import Row

MAX_EVENTS_BYTES = 32 << 20
MAX_LOSS_POINTS = 200
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


def job_story(ctl: Control, row: Row) -> Story:
    rows, _ = ctl.store.list_events(job_id=row["id"], limit=500)
    story = Story([Item(e["created_at"], "server", e["kind"], e["message"]) for e in rows])
    runtime = read_runtime_events(ctl.run_dir(row["id"]) / EVENTS_FILE, story)
    story.items.extend(_runtime_item(e) for e in runtime if e["event"] in RUNTIME_KINDS)
    story.items.sort(key=lambda i: i.at_s)
    story.goodput = row["summary"] if _is_final(row["summary"]) else _live_goodput(runtime)
    return story


def read_runtime_events(path: Path, story: Story) -> list[dict[str, Any]]:
    """Every non-step event, and a thinned loss curve into `story`."""
    info = stat_job_file(path)  # the job writes it: no links followed
    if info is None or info.st_size > MAX_EVENTS_BYTES:
        return []
    lines = (read_job_text(path, limit=MAX_EVENTS_BYTES) or "").splitlines()
    steps = [line for line in lines if line.startswith('{"event": "step"')]
    every = max(1, len(steps) // MAX_LOSS_POINTS)
    for i, line in enumerate(steps):
        if i % every == 0 or i == len(steps) - 1:
            e = _parse(line)
            if e and isinstance(e.get("loss"), int | float):
                story.steps.append(float(e["step"]))
                story.losses.append(float(e["loss"]))
                story.last_step = int(e["step"])
    events = [_parse(line) for line in lines if not line.startswith('{"event": "step"')]
    return [e for e in events if e is not None and "event" in e]


def _parse(line: str) -> dict[str, Any] | None:
    try:
        e = json.loads(line)
    except ValueError:
        return None  # a torn last line
    return e if isinstance(e, dict) else None


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


def _live_goodput(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The goodput so far of a running job (the runtime's own accounting)."""
    if not events:
        return None
    try:
        return summarize(events)
    except (KeyError, ValueError, TypeError, ZeroDivisionError):
        return None
