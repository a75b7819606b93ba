"""A job's goodput over all its attempts: what its user waited for, not one launcher's view.

Each server attempt runs one launcher, whose summary (argosy.runtime.goodput) accounts
only its own run: a job that lost a node and resumed shows its last attempt's figures
and "no faults". The server keeps, beside each attempt's summary, the figures this account reads
(`server/attempt<k>/account.json`, `account_figures`: numbers only, a few hundred bytes
whatever the job's summary held, so an exit never rereads every earlier attempt's
summary), with the span it saw (`span_s`: start and end by the server's clock), and, when
an attempt ends, folds them into `job_account`:

- wall_s: the first attempt's start to the last one's end.
- productive_s: each attempt's productive seconds, less the steps a later attempt redid
  (its final step past the earliest step a later attempt resumed from, at its mean step
  time: productive seconds over the steps from where it resumed to its final step). An
  attempt with no summary (its launcher killed with its node) is credited the steps the
  earliest later attempt resumed past where it began, at the nearest known step time. No
  attempt is credited more than its span: the job's word is bounded by the server's clock.
- lost_s: the runtime's causes summed over the attempts (scaled into each span should
  they exceed it), and the server's own: `redone_after_loss` (the redone steps above),
  `outside_launcher` (what of a span the launcher did not account: starting it, a node
  loss the server noticed first, an attempt with no summary) and `between_attempts`
  (waiting to be placed again). productive_s + every lost_s = wall_s.
- effective_training_time = productive_s / wall_s.
- attempts; restarts: the runtime's plus each attempt followed by another; faults: the
  runtime's, plus each attempt the server saw end lost or failed whose runtime did not
  record the fault that ended it (a launcher killed with its node); a cancel, a
  preemption or a resize is no fault.

    write_figures(attempt_dir(run_dir, k), summary)     # as attempt k is settled
    account = job_account(kept_figures(run_dir, attempts))
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argosy.executors.local import attempt_dir
from argosy.runtime.goodput import CAUSES
from argosy.server.job_json import number

SPAN_KEY = "span_s"
HOW = (
    "over all attempts: productive = each attempt's steps not redone by a later one; lost = "
    "wall (first start to last end, by the server's clock) - productive, by cause: the "
    "runtime's, redone_after_loss, outside_launcher, between_attempts"
)
SERVER_CAUSES = ("redone_after_loss", "outside_launcher", "between_attempts")


@dataclass
class _Attempt:
    """One attempt's figures, each a number the server accepts or None."""

    number: int
    start_s: float
    end_s: float
    summarized: bool
    productive_s: float | None = None
    final_step: float | None = None
    resumed_from: float | None = None
    step_s: float | None = None
    restarts: float = 0.0
    faults: int = 0
    server_fault: bool = False
    """It ended lost or failed, a fault its runtime's own count does not hold."""
    lost: dict[str, float] = field(default_factory=dict)

    @property
    def span(self) -> float:
        return self.end_s - self.start_s


FIGURES_FILE = "account.json"
FIGURE_KEYS = {"productive_s": None, "final_step": None, "resumed_from": None, "restarts": 1e6}
"""The figures kept, each with its upper bound (a restart count past it is not one)."""


ENDINGS = ("succeeded", "lost", "failed", "stopped")
"""How the server saw an attempt end: `stopped` is a cancel, a preemption or a resize
(no fault); `lost` and `failed` are faults unless the runtime recorded the one that
ended its run itself (`fault_ended_run`)."""


def account_figures(summary: dict[str, Any], ended: str | None = None) -> dict[str, Any]:
    """What `job_account` reads of an attempt's kept summary: its span, its figures as
    accepted numbers (else None), its faults as a count and whether the last of them
    ended the run (a stopping fault past its restarts), its lost seconds by the
    runtime's causes, and how the server saw it end (`ENDINGS`)."""
    faults = summary.get("faults") if isinstance(summary.get("faults"), list) else []
    lost = summary.get("lost_s") if isinstance(summary.get("lost_s"), dict) else {}
    figures = {key: number(summary.get(key), 0, high) for key, high in FIGURE_KEYS.items()}
    stopping = sum(1 for f in faults if isinstance(f, dict) and "action" not in f)
    return {
        SPAN_KEY: summary.get(SPAN_KEY),
        "ended": ended if ended in ENDINGS else None,
        **figures,
        "faults": len(faults),
        "fault_ended_run": stopping > (figures["restarts"] or 0),
        "lost_s": {cause: number(lost.get(cause), low=0) for cause in CAUSES},
    }


def write_figures(where: Path, summary: dict[str, Any], ended: str | None = None) -> None:
    """Keep `account_figures(summary, ended)` in the attempt directory `where`."""
    tmp = where / (FIGURES_FILE + ".tmp")
    tmp.write_text(json.dumps(account_figures(summary, ended)))
    tmp.replace(where / FIGURES_FILE)


def kept_figures(run_dir: Path, attempts: int) -> list[dict[str, Any]]:
    """The kept figures of attempts 1..`attempts` (the server's own small files; one
    that cannot be read is an empty dict, i.e. an attempt with no span)."""
    out = []
    for k in range(1, attempts + 1):
        try:
            data = json.loads((attempt_dir(run_dir, k) / FIGURES_FILE).read_text())
        except (OSError, ValueError):
            data = {}
        out.append(data if isinstance(data, dict) else {})
    return out


def job_account(figures: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The job's goodput over the attempts whose kept figures (`account_figures`) are
    given, oldest first; None when none of them carries a span."""
    given = list(figures)
    attempts = [a for k, f in enumerate(given, 1) if (a := _attempt(f, k)) is not None]
    if not attempts:
        return None
    credits, redone = _credits(attempts)
    lost = dict.fromkeys((*CAUSES, *SERVER_CAUSES), 0.0)
    for a, credit, again in zip(attempts, credits, redone, strict=True):
        inside = _fit(a.lost, a.span - credit - again)
        for cause, seconds in inside.items():
            lost[cause] += seconds
        lost["redone_after_loss"] += again
        lost["outside_launcher"] += max(0.0, a.span - credit - again - sum(inside.values()))
    wall = max(a.end_s for a in attempts) - attempts[0].start_s
    lost["between_attempts"] = max(0.0, wall - sum(a.span for a in attempts))
    productive = sum(credits)
    followed = attempts[:-1]
    return {
        "attempts": len(given),
        "wall_s": round(wall, 3),
        "productive_s": round(productive, 3),
        "effective_training_time": round(min(1.0, productive / wall), 4) if wall > 0 else 0.0,
        "lost_s": {cause: round(seconds, 3) for cause, seconds in lost.items()},
        "restarts": int(sum(a.restarts for a in attempts)) + len(followed),
        "faults": sum(a.faults + a.server_fault for a in attempts),
        "estimated": [a.number for a in attempts if not a.summarized],
        "how": HOW,
    }


def _attempt(summary: dict[str, Any], k: int) -> _Attempt | None:
    """An attempt's accepted figures (from its kept figures: `faults` a count); None
    without a span the server recorded."""
    span = summary.get(SPAN_KEY)
    if not (isinstance(span, list) and len(span) == 2):
        return None
    start, end = (number(v) for v in span)
    if start is None or end is None:
        return None
    a = _Attempt(number=k, start_s=start, end_s=max(start, end), summarized=False)
    by_fault = summary.get("ended") in ("lost", "failed")
    a.server_fault = by_fault and summary.get("fault_ended_run") is not True
    productive = number(summary.get("productive_s"), low=0)
    if productive is None:
        return a
    a.summarized = True
    a.productive_s = min(productive, a.span)
    a.final_step = number(summary.get("final_step"), low=0)
    a.resumed_from = number(summary.get("resumed_from"), low=0)
    if a.final_step is not None and a.resumed_from is not None and a.final_step > a.resumed_from:
        a.step_s = a.productive_s / (a.final_step - a.resumed_from)
    a.restarts = number(summary.get("restarts"), low=0) or 0.0
    a.faults = int(number(summary.get("faults"), 0, 1e6) or 0)
    lost = summary.get("lost_s")
    if isinstance(lost, dict):
        a.lost = {c: number(lost.get(c), low=0) or 0.0 for c in CAUSES}
    return a


def _credits(attempts: list[_Attempt]) -> tuple[list[float], list[float]]:
    """(productive seconds credited, seconds redone by a later attempt), per attempt."""
    known = [a.step_s for a in attempts if a.step_s]
    credits, redone = [], []
    reached = attempts[0].resumed_from or 0.0
    for k, a in enumerate(attempts):
        began = a.resumed_from if a.resumed_from is not None else reached
        nxt = _resumed_later(attempts[k + 1 :])
        step_s = a.step_s or _typical_step_s(known)
        if a.summarized:
            final = a.final_step if a.final_step is not None else began
            kept_to = min(final, nxt) if nxt is not None else final
            again = min(a.productive_s or 0.0, max(0.0, final - kept_to) * step_s)
            credit = (a.productive_s or 0.0) - again
        else:
            kept_to = nxt if nxt is not None else began
            again, credit = 0.0, min(a.span, max(0.0, kept_to - began) * step_s)
        credits.append(credit)
        redone.append(again)
        reached = max(began, kept_to)
    return credits, redone


def _resumed_later(later: list[_Attempt]) -> float | None:
    """The earliest step a later attempt resumed from (None: none says): an attempt's
    steps past it were redone, whether by the next attempt or, when that one left no
    figures (killed with its node before its launcher logged), by a later one."""
    steps = [a.resumed_from for a in later if a.resumed_from is not None]
    return min(steps) if steps else None


def _typical_step_s(step_times: list[float]) -> float:
    """A step time for an attempt that reported none: the median of the others (0 when
    no attempt reported one: no credit can be estimated)."""
    return statistics.median_high(step_times) if step_times else 0.0


def _fit(lost: dict[str, float], room: float) -> dict[str, float]:
    """The runtime's lost seconds by cause, scaled down to fit in `room` seconds."""
    total = sum(lost.values())
    if total <= max(room, 0.0) or total == 0:
        return dict(lost)
    scale = max(room, 0.0) / total
    return {cause: seconds * scale for cause, seconds in lost.items()}
