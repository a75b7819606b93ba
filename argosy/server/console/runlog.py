"""A running job's runtime event log (`events.jsonl`), read a little at a time.

The job page and the overview show what the runtime measured while a job still runs:
its live goodput (`argosy.runtime.goodput.summarize` over the events so far, the same
accounting as the final summary), its loss curve and its last step. The log grows by
one line per step, so reading it whole on every page view would cost more the longer a
job runs. `RunLog` instead remembers how far it has read and keeps a digest:

- every event that is not a step, as written (spawns, faults, resumes, checkpoints);
- of the steps, per launcher attempt, the first and the last, and the step each of the
  newest checkpoints or commits was taken at (the step a later attempt resumes from),
  found among the newest `RECENT_STEPS` steps as a checkpoint is logged a few steps
  late. The accounting sums step durations (end minus previous end), which telescope,
  so these steps give the same productive and redone seconds as every step would;
- a loss curve thinned to at most `2 x MAX_POINTS` points.

A view then reads only the bytes appended since the last one (plus the log's first
line, to notice a new launch, which archives the old log and starts a new one), and
the digest's size does not grow with the number of steps.

    logs = RunLogs()
    log = logs.get(job_id, run_dir / "events.jsonl")   # read what was appended
    log.goodput()          # the summary dict so far, or None before any event
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argosy.runtime.goodput import summarize
from argosy.server.job_json import loads_job_json
from argosy.server.views import read_log_chunk

READ_BYTES = 4 << 20
"""Bytes read from a log per read; a view reads at most `VIEW_BYTES`."""
VIEW_BYTES = 16 << 20
"""Most bytes one view reads (a long log is caught up over a few views)."""
HEAD_BYTES = 256
"""Bytes of the log's first line compared to notice a new launch."""
MAX_POINTS = 200
"""The loss curve keeps between MAX_POINTS and 2 x MAX_POINTS points."""
MAX_LOGS = 256
"""Run logs kept in memory (least recently viewed dropped first)."""
ANCHORS = ("checkpoint", "commit")
"""Events whose step a later attempt may resume from."""
MAX_ANCHORS = 16
"""Checkpoint steps remembered per attempt."""
RECENT_STEPS = 256
"""Newest steps kept per attempt to place a checkpoint logged after later steps."""

Seen = tuple[int, dict[str, Any]]
"""(line number, event): the line number keeps the log's own order."""


@dataclass
class _Attempt:
    """The steps of one launcher attempt that the accounting needs."""

    first: Seen | None = None
    last: Seen | None = None
    anchors: dict[int, Seen] = field(default_factory=dict)
    """Checkpoint step -> the last step event at or before it (the newest MAX_ANCHORS:
    a restart resumes from one of the newest checkpoints)."""
    open: list[int] = field(default_factory=list)
    """Anchors logged before the step they name: a later step event may still fill them."""
    recent: deque[Seen] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    """The newest steps: a checkpoint is logged a few steps after the step it saved."""

    def add_step(self, seen: Seen) -> None:
        if self.first is None:
            self.first = seen
        self.last = seen
        self.recent.append(seen)
        step = seen[1]["step"]
        for at in self.open:
            if at in self.anchors and self.anchors[at][1]["step"] < step <= at:
                self.anchors[at] = seen
        self.open = [at for at in self.open if at > step]

    def add_anchor(self, step: int) -> None:
        if self.last is None or step in self.anchors:
            return
        held = next((s for s in reversed(self.recent) if s[1]["step"] <= step), None)
        if held is None:
            return  # older than the steps kept: an earlier anchor stands in for it
        self.anchors[step] = held
        if held[1]["step"] < step:
            self.open.append(step)
        if len(self.anchors) > MAX_ANCHORS:
            del self.anchors[min(self.anchors)]

    def kept(self) -> list[Seen]:
        """First, anchors and last, each once."""
        kept = [self.first, *self.anchors.values(), self.last]
        return list({seen[0]: seen for seen in kept if seen is not None}.values())


@dataclass
class _Digest:
    """What one launch's log says so far (see the module docstring)."""

    lines: int = 0
    events: list[Seen] = field(default_factory=list)
    attempts: dict[int, _Attempt] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)
    stride: int = 1
    steps_seen: int = 0
    last_step: int = 0
    last_point: tuple[float, float] | None = None

    def add(self, line: bytes) -> None:
        self.lines += 1
        try:
            e = loads_job_json(line)
        except ValueError:
            return  # garbled: skipped, as read_events does
        if not isinstance(e, dict) or not isinstance(e.get("event"), str):
            return
        if e["event"] == "step":
            self._add_step(e)
            return
        self.events.append((self.lines, e))
        if e["event"] in ANCHORS and isinstance(e.get("step"), int):
            self._attempt(e).add_anchor(e["step"])

    def _add_step(self, e: dict[str, Any]) -> None:
        if not isinstance(e.get("step"), int) or not isinstance(e.get("t"), int | float):
            return
        self._attempt(e).add_step((self.lines, e))
        self.last_step = e["step"]
        if not isinstance(e.get("loss"), int | float):
            return
        self.last_point = (float(e["step"]), float(e["loss"]))
        if self.steps_seen % self.stride == 0:
            self.curve.append(self.last_point)
            if len(self.curve) >= 2 * MAX_POINTS:  # from now on every other point
                self.curve = self.curve[::2]
                self.stride *= 2
        self.steps_seen += 1

    def _attempt(self, e: dict[str, Any]) -> _Attempt:
        attempt = e.get("attempt")
        return self.attempts.setdefault(attempt if isinstance(attempt, int) else 0, _Attempt())

    def kept(self) -> list[dict[str, Any]]:
        """The kept events and steps in the log's order (what `summarize` reads)."""
        steps = [seen for a in self.attempts.values() for seen in a.kept()]
        return [e for _, e in sorted([*self.events, *steps], key=lambda seen: seen[0])]


class RunLog:
    """One job's `events.jsonl`, read incrementally (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.head = b""
        self.offset = 0
        self.digest = _Digest()
        self._goodput: dict[str, Any] | None = None
        self._stale = False

    def update(self) -> None:
        """Read what was appended since the last call (from the start after a relaunch)."""
        head = read_log_chunk(self.path, 0, HEAD_BYTES)
        if not head or head[: len(self.head)] != self.head:
            self.offset, self.digest, self._goodput = 0, _Digest(), None  # a new launch
        self.head = head
        for _ in range(VIEW_BYTES // READ_BYTES):
            data = read_log_chunk(self.path, self.offset, READ_BYTES)
            end = data.rfind(b"\n") + 1  # a torn last line waits for its end
            for line in data[:end].splitlines():
                self.digest.add(line)
            self.offset += end
            self._stale = self._stale or end > 0
            if len(data) < READ_BYTES:
                return

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event that is not a step, in the log's order."""
        return [e for _, e in self.digest.events]

    @property
    def curve(self) -> list[tuple[float, float]]:
        """(step, loss) points, thinned evenly, and the last one."""
        curve, last = self.digest.curve, self.digest.last_point
        return curve if last is None or (curve and curve[-1] == last) else [*curve, last]

    @property
    def last_step(self) -> int:
        return self.digest.last_step

    def goodput(self) -> dict[str, Any] | None:
        """The runtime's accounting over the events so far (None before any)."""
        if self._stale:
            self._stale = False
            self._goodput = _summarize(self.digest.kept()) if self.digest.events else None
        return self._goodput


def _summarize(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return summarize(events)
    except (KeyError, ValueError, TypeError, ZeroDivisionError, AttributeError):
        return None  # a log the accounting cannot read (hand-written, cut short)


class RunLogs:
    """The run logs of recently viewed jobs, least recently viewed dropped first."""

    def __init__(self, capacity: int = MAX_LOGS) -> None:
        self.capacity = capacity
        self._logs: OrderedDict[str, RunLog] = OrderedDict()

    def get(self, job_id: str, path: Path) -> RunLog:
        """The job's log, caught up with what was appended since the last view."""
        log = self._logs.pop(job_id, None)
        if log is None or log.path != path:
            log = RunLog(path)
        self._logs[job_id] = log
        while len(self._logs) > self.capacity:
            self._logs.popitem(last=False)
        log.update()
        return log
