"""The run directory's event log (events.jsonl) and its atomically written summary.

Every line is one JSON object with `event` (its type), `t` (seconds since launch) and
`wall` (UTC ISO time). Lines are appended and flushed one by one; a reader skips a torn
last line, so a launcher killed mid-write never leaves a log that reads as something else.

log = EventLog(run_dir / "events.jsonl", t0=clock.now_s(), clock=clock)
log.emit("fault", kind="crash", rank=1)     # `listener`, if given, sees each record too
read_events(run_dir / "events.jsonl")
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from argosy.core.clock import Clock

EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"


class EventLog:
    """Appends events to a JSONL file, stamping each with its time since launch."""

    def __init__(
        self,
        path: Path,
        *,
        t0: float,
        clock: Clock,
        listener: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.path = path
        self.t0 = t0
        self._clock = clock
        self._listener = listener
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def since_launch(self, monotonic_s: float) -> float:
        """Convert a monotonic time (as ranks write them) to seconds since launch."""
        return round(monotonic_s - self.t0, 4)

    def emit(self, event: str, *, t: float | None = None, **fields: Any) -> dict[str, Any]:
        """Append one event; `t` defaults to now, in seconds since launch."""
        record = {
            "event": event,
            "t": round(self._clock.now_s() - self.t0, 4) if t is None else round(t, 4),
            "wall": datetime.now(UTC).isoformat(timespec="milliseconds"),
            **fields,
        }
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        if self._listener is not None:
            self._listener(record)
        return record

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event in the log; a torn or garbled line is skipped, not trusted."""
    return parse_events(path.read_text(encoding="utf-8"))


def parse_events(text: str) -> list[dict[str, Any]]:
    """The events of an events.jsonl text (what `read_events` returns for its file)."""
    events = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # garbled, or nested past the stack
            continue
        if isinstance(record, dict) and "event" in record:
            events.append(record)
    return events


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file, fsync, then rename over `path`: readers see old or new."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
