"""Goodput accounting: from the event log to wall, productive and lost time by cause.

Pure: `summarize(events)` reads the list of events `agent` wrote and returns the summary
dict stored as summary.json. How each figure is computed:

- productive_s: the durations of the steps that count, i.e. every step of the last
  attempt and, of earlier attempts, the steps up to the step the next attempt resumed
  from. A step's duration is the time from the previous step's end (or the resume) to
  its end.
- lost_s.startup: launch to the first attempt's resume (spawn, imports, group init).
- lost_s.detection: the fault's start (injection time, else the stall's start, else the
  last step's end) to its detection.
- lost_s.restart: detection to the next attempt's ranks all attached (stop the group,
  spawn, imports, process-group init).
- lost_s.reload: attached to resumed (checkpoint load, agreement between ranks).
- lost_s.redone: steps done after the checkpoint that the next attempt resumed from,
  plus the partial step in flight when the fault struck.
- lost_s.other: the rest of the wall time (final shutdown, gaps between polls).
- effective_training_time = productive_s / wall_s.
- restarts: `restart` events, i.e. group restarts that happened; the fault that spent the
  budget (action `give_up`) is listed among the faults but is not a restart.
- preflight: with `launch --preflight`, the node check's verdict, the devices used and
  those left out (with the checks that failed them), or why the launch was refused.
- checkpoints: snapshots taken (`checkpoint` events); last_commit: the newest step rank 0
  saw committed on disk (`commit` events), the one a restart is sure to find.
- resumed_from: the step the run's first attempt resumed from (0 for a fresh start, None
  when it never resumed): productive_s is the time of steps resumed_from+1..final_step,
  which the server uses to account a job over its attempts (argosy.server.job_goodput).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from argosy.runtime.events import read_events

CAUSES = ("startup", "detection", "restart", "reload", "redone", "other")
STOPPED = ("restart", "give_up")
"""Fault actions that stopped the group: a restart followed, or the budget was spent."""


def summarize_file(path: Path) -> dict[str, Any]:
    return summarize(read_events(path))


def _by_attempt(events: list[dict], kind: str) -> dict[int, dict]:
    return {e["attempt"]: e for e in events if e["event"] == kind}


Interval = tuple[float, float]
"""(start s, end s) since launch; its length may be negative only where the log's own
times are out of order, and then it counts as the log says."""


def time_buckets(events: list[dict[str, Any]]) -> dict[str, list[Interval]]:
    """The intervals behind the summary's figures: `productive` (the steps that count),
    `steps` (how many), and one list per cause but `other` (the rest of the wall time).
    `summarize` adds up these same intervals, so what is charged to them (energy, say)
    falls in the same buckets as the time."""
    return _account(events)[0]


def _account(events: list[dict[str, Any]]) -> tuple[dict[str, list[Interval]], list[dict]]:
    steps: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e["event"] == "step":
            steps[e["attempt"]].append(e)
    resumes = _by_attempt(events, "resume")
    attached = _by_attempt(events, "attached")
    stopping = [e for e in events if e["event"] == "fault" and e.get("action") in STOPPED]
    faults_by_attempt = {e["attempt"]: e for e in stopping}
    attempts = sorted({e["attempt"] for e in events if e["event"] == "spawn"})
    buckets: dict[str, list[Interval]] = {k: [] for k in ("productive", *CAUSES[:-1])}
    faults = []
    for a in attempts:
        keep_to = resumes.get(a + 1, {}).get("step") if a in faults_by_attempt else None
        kept, redone = _split(steps[a], resumes.get(a), keep_to)
        buckets["productive"] += kept
        if a == 0 and a in resumes:
            buckets["startup"].append((0.0, resumes[a]["t"]))
        if a in faults_by_attempt:
            spans = _fault_spans(faults_by_attempt[a], steps[a], redone, resumes, attached)
            for cause, intervals in spans.items():
                buckets[cause] += intervals
            faults.append(_fault_record(faults_by_attempt[a], spans, resumes))
    return buckets, faults


def _seconds(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's summary; see the module docstring for how each number is computed."""
    buckets, faults = _account(events)
    steps: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e["event"] == "step":
            steps[e["attempt"]].append(e)
    resumes = _by_attempt(events, "resume")
    attempts = sorted({e["attempt"] for e in events if e["event"] == "spawn"})
    wall = max((e["t"] for e in events), default=0.0)
    productive = _seconds(buckets["productive"])
    lost = {cause: _seconds(buckets[cause]) for cause in CAUSES[:-1]}
    faults += [
        _warning(e) for e in events if e["event"] == "fault" and e.get("action") not in STOPPED
    ]
    faults.sort(key=lambda f: f["detected_at_s"])
    lost["other"] = max(0.0, wall - productive - sum(lost.values()))
    final_step, final_loss = _final(steps, resumes, attempts)
    return {
        "final_step": final_step,
        "final_loss": final_loss,
        "wall_s": round(wall, 3),
        "productive_s": round(productive, 3),
        "effective_training_time": round(productive / wall, 4) if wall > 0 else 0.0,
        "lost_s": {k: round(v, 3) for k, v in lost.items()},
        "restarts": sum(1 for e in events if e["event"] == "restart"),
        "attempts": len(attempts),
        "faults": faults,
        "checkpoints": sum(1 for e in events if e["event"] == "checkpoint"),
        "last_commit": max((e["step"] for e in events if e["event"] == "commit"), default=None),
        "resumed_from": resumes.get(attempts[0], {}).get("step") if attempts else None,
        "how": "productive = durations of steps not redone; lost = wall - productive, by cause "
        "(startup before the first step, per fault: detection, restart, reload, redone steps; "
        "the rest as other)",
        "preflight": _preflight(events),
    }


def _preflight(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The preflight's verdict and device choice (its checks stay in the event log)."""
    for e in events:
        if e["event"] == "preflight":
            keys = ("verdict", "checked", "use", "excluded", "refused", "node_warnings")
            return {k: e.get(k) for k in keys}
    return None


def _final(
    steps: dict[int, list[dict]], resumes: dict[int, dict], attempts: list[int]
) -> tuple[int, float | None]:
    """The last attempt's last step (or, when it resumed at the end and took no step, the
    step it resumed from) and the loss last recorded for that step."""
    if not attempts:
        return 0, None
    last = attempts[-1]
    if steps[last]:
        return steps[last][-1]["step"], steps[last][-1]["loss"]
    step = resumes.get(last, {}).get("step") or 0
    losses = [e["loss"] for a in attempts for e in steps[a] if e["step"] == step]
    return step, (losses[-1] if losses else None)


def _split(
    attempt_steps: list[dict], resume: dict | None, keep_to: int | None
) -> tuple[list[Interval], list[Interval]]:
    """(kept intervals, redone intervals) of one attempt's steps."""
    kept: list[Interval] = []
    redone: list[Interval] = []
    prev = resume["t"] if resume else None
    for e in attempt_steps:
        span = (prev if prev is not None else e["t"], e["t"])
        prev = e["t"]
        (kept if keep_to is None or e["step"] <= keep_to else redone).append(span)
    return kept, redone


def _fault_spans(
    fault: dict, attempt_steps: list[dict], redone: list[Interval], resumes: dict, attached: dict
) -> dict[str, list[Interval]]:
    """What one stopping fault cost, by cause, as intervals since launch."""
    a = fault["attempt"]
    detected = fault["detected_at_s"]
    last_end = attempt_steps[-1]["t"] if attempt_steps else resumes.get(a, {}).get("t", detected)
    start = fault.get("injected_at_s") or fault.get("stalled_since_s") or last_end
    start = min(start, detected)
    nxt_attached = attached.get(a + 1, {}).get("t")
    nxt_resume = resumes.get(a + 1, {})
    partial = [(last_end, start)] if start > last_end else []
    return {
        "detection": [(start, detected)],
        "restart": [(detected, nxt_attached)] if nxt_attached is not None else [],
        "reload": [(nxt_attached, nxt_resume["t"])] if nxt_resume and nxt_attached else [],
        "redone": redone + partial,
    }


def _fault_record(fault: dict, spans: dict[str, list[Interval]], resumes: dict) -> dict[str, Any]:
    (start, detected), *_ = spans["detection"]
    nxt_resume = resumes.get(fault["attempt"] + 1, {})
    return {
        "kind": fault["kind"],
        "rank": fault["rank"],
        "attempt": fault["attempt"],
        "detail": fault.get("detail"),
        "injected_at_s": fault.get("injected_at_s"),
        "detected_at_s": detected,
        "detect_latency_s": round(detected - start, 3),
        "resumed_from_step": nxt_resume.get("step"),
        "lost_s": {k: round(_seconds(v), 3) for k, v in spans.items()},
        **{
            k: fault[k]
            for k in ("missing_ranks", "collective_seq", "slowdown", "exit_code", "last_lines")
            if k in fault
        },
    }


def _warning(fault: dict) -> dict[str, Any]:
    start = fault.get("injected_at_s")
    detected = fault["detected_at_s"]
    return {
        "kind": fault["kind"],
        "rank": fault["rank"],
        "attempt": fault["attempt"],
        "detail": fault.get("detail"),
        "action": fault.get("action"),
        "injected_at_s": start,
        "detected_at_s": detected,
        "detect_latency_s": round(detected - start, 3) if start is not None else None,
        "resumed_from_step": None,
        "slowdown": fault.get("slowdown"),
    }
