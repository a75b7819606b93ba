"""Per-attempt summaries: which `summary.json` belongs to which attempt of a job.

`argosy launch` writes `<run dir>/summary.json` (a `{"status": "running"}` placeholder at
start, the goodput summary at the end). A launcher killed by a signal never writes the
final one, and one killed before it started leaves the previous attempt's file in place.
So the server stamps each attempt when it starts it (`server/attempt<N>/started`) and,
when the attempt ends, takes `summary.json` only if it was written after that stamp and
is final; otherwise the attempt's summary is marked missing with the reason, and where
the launcher's event log of this attempt is there (`events.jsonl`, written as it ran:
on Ray, in the shared run directory even when node rank 0's node went) its figures are
the runtime's summary of that log up to its last event (`from_events`). Either way
it is kept as `server/attempt<N>/summary.json`, one per attempt. A multi-node attempt's
node rank i (i > 0) writes `<run dir>/node<i>/summary.json`; the kept summary is node rank
0's with `nodes`, one row per node rank (its node, status, final step, effective training
time, lost seconds, restarts, faults, wall seconds and metered joules), each read under
the same rules. `exit_time` is when
the attempt ended by its own record (`exit.code`), which a server down at the time missed.

    stamp_attempt(run_dir, 2)
    summary = settle_summary(run_dir, 2, "the launcher was killed by SIGKILL (exit 137)")
    summary = settle_summary(run_dir, 2, "", nodes=["n0", "n1"])   # with summary["nodes"]
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from argosy.core.confined import stat_job_file
from argosy.executors.local import attempt_dir
from argosy.runtime.events import EVENTS_FILE, parse_events
from argosy.runtime.goodput import summarize
from argosy.server.energy import node_energy
from argosy.server.job_goodput import SPAN_KEY, write_figures
from argosy.server.job_json import loads_job_json, number
from argosy.server.read_ahead import parsed, read_ahead

STAMP = "started"
SUMMARY_LIMIT_BYTES = 16 << 20
"""The job writes summary.json: read as such (`read_job_text`), and at most this much."""
EXIT_RECORD = "exit.code"
SERVER_KEYS = ("attempt", "nodes", "span_s", "job")
"""Keys of a kept summary that the server sets: a job's own are dropped (a single-node
job's `nodes` would otherwise name nodes, and energy, of its choosing)."""


def stamp_attempt(run_dir: Path, attempt: int) -> None:
    """Mark the moment attempt `attempt` starts (before its launcher runs)."""
    where = attempt_dir(run_dir, attempt)
    where.mkdir(parents=True, exist_ok=True)
    (where / STAMP).write_text("")


def settle_summary(
    run_dir: Path,
    attempt: int,
    reason: str,
    nodes: list[str] | None = None,
    span: tuple[float, float] | None = None,
    ended: str | None = None,
) -> dict[str, Any]:
    """The summary of attempt `attempt`, kept in its attempt directory; with two or more
    `nodes` (by node rank) it carries a row per node rank, with `span` (its start and end
    by the server's clock) `span_s`. Beside it go the figures the job's account over
    attempts reads, with `ended` (how the server saw it end: `job_goodput.ENDINGS`)."""
    where = attempt_dir(run_dir, attempt)
    summary = _checked(_node_summary(run_dir, where / STAMP, attempt, reason))
    summary = {k: v for k, v in summary.items() if k not in SERVER_KEYS} | {"attempt": attempt}
    if span is not None:
        summary[SPAN_KEY] = [round(span[0], 3), round(span[1], 3)]
    if nodes is not None and len(nodes) > 1:
        others = [_checked(_node_summary(run_dir / f"node{i}", where / STAMP, attempt, reason))
                  for i in range(1, len(nodes))]  # fmt: skip
        summary["nodes"] = [_node_row(i, n, s) for i, (n, s) in
                            enumerate(zip(nodes, [summary, *others], strict=True))]  # fmt: skip
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / "summary.json.tmp"
    tmp.write_text(json.dumps(summary))
    os.replace(tmp, where / "summary.json")  # never half-written
    write_figures(where, summary, ended)  # what the job's account over attempts reads
    return capped(without_output(summary))


STORED_LIMIT_BYTES = 64 << 10
"""The most a summary the server stores (and shows every token) may be, as JSON: the
job writes summary.json, and what it writes is bounded here; the whole file stays in the
attempt directory."""
DROPPED_KEY = "dropped"
"""Marks a stored summary whose largest keys were left out to fit `STORED_LIMIT_BYTES`."""
NAMES, NAME_CHARS, MARKER_BYTES = 10, 60, 8192
"""The marker names at most `NAMES` keys of each kind, each cut to `NAME_CHARS` bytes of
JSON: it fits in `MARKER_BYTES`."""


def capped(summary: dict[str, Any], limit: int = STORED_LIMIT_BYTES) -> dict[str, Any]:
    """`summary` within `limit` bytes of JSON: whole when it fits; otherwise the server's
    own keys and then the job's, smallest first, while they fit. A list that does not fit
    whole (a long run's `faults`) keeps its newest items that do; `dropped` names (the
    first 10 of) the keys left out and, under `shortened`, each list's kept and whole
    lengths (names cut to 60 bytes of JSON: the marker fits its reserve however escaped).
    The result is measured whole at the end: it never passes `limit`."""
    sizes = {k: len(json.dumps(v)) + _key_bytes(k) for k, v in summary.items()}
    if sum(sizes.values()) + 2 <= limit:
        return summary
    room = limit - MARKER_BYTES
    order = sorted(summary, key=lambda k: (k not in SERVER_KEYS, sizes[k]))
    kept: dict[str, Any] = {}
    left_out: list[str] = []
    shortened: dict[str, dict[str, int]] = {}
    for key in order:
        value = summary[key]
        if sizes[key] <= room:
            kept[key], room = value, room - sizes[key]
        elif isinstance(value, list) and (tail := _newest_within(value, room - _key_bytes(key))):
            kept[key], room = tail, room - len(json.dumps(tail)) - _key_bytes(key)
            shortened[marker_name(key)] = {"kept": len(tail), "of": len(value)}
        else:
            left_out.append(key)
    names = [marker_name(k) for k in left_out[:NAMES]]
    kept[DROPPED_KEY] = {
        "keys": names,
        "more": len(left_out) - len(names),
        "shortened": dict(list(shortened.items())[:NAMES]),
        "why": f"the summary is over {limit} bytes; the attempt's summary.json has it whole",
    }
    while len(json.dumps(kept)) > limit:  # a miscount somewhere: drop the largest job key
        own = [k for k in kept if k not in SERVER_KEYS and k != DROPPED_KEY]
        if not own:
            break
        del kept[max(own, key=lambda k: sizes[k])]
        kept[DROPPED_KEY]["more"] += 1
    return kept


def _key_bytes(key: str) -> int:
    """What a key adds to its entry's JSON besides the value: `"key": ` and `, `."""
    return len(json.dumps(key)) + 4


def marker_name(key: str) -> str:
    """`key` cut so that its JSON takes at most NAME_CHARS + 2 bytes (escapes counted)."""
    n = min(len(key), NAME_CHARS)
    while len(json.dumps(key[:n])) > NAME_CHARS + 2:
        n -= 1
    return key[:n]


def _newest_within(items: list[Any], room: int) -> list[Any]:
    """The longest tail of `items` whose JSON takes at most `room` bytes (maybe empty)."""
    used, start = 2, len(items)
    while start > 0:
        size = len(json.dumps(items[start - 1])) + 2
        if used + size > room:
            break
        used, start = used + size, start - 1
    return items[start:]


OUTPUT_KEYS = ("last_lines",)
"""Keys of a runtime summary's `cause` and `faults` that quote the ranks' output (their
last log lines): the kept file (root's, in the attempt directory) has them, the summary
the server stores and shows every token does not. A job's output is its queue's and the
admins' (its logs); other tenants read its states, events and figures."""


def without_output(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` less the `OUTPUT_KEYS` of its `cause` and of each of its `faults`."""
    out = dict(summary)
    if isinstance(out.get("cause"), dict):
        out["cause"] = {k: v for k, v in out["cause"].items() if k not in OUTPUT_KEYS}
    if isinstance(out.get("faults"), list):
        out["faults"] = [
            {k: v for k, v in f.items() if k not in OUTPUT_KEYS} if isinstance(f, dict) else f
            for f in out["faults"]
        ]
    return out


def _node_summary(directory: Path, stamp: Path, attempt: int, reason: str) -> dict[str, Any]:
    summary = _final_summary_since(directory / "summary.json", stamp)
    if summary is not None:
        return summary
    why = f"attempt {attempt} wrote no final summary.json: {reason}"
    cut = _summary_from_events(directory / EVENTS_FILE, stamp)
    if cut is None:
        return {"status": "missing", "detail": why}
    why += "; its figures are from its event log, up to its last event"
    return cut | {"status": "missing", "detail": why, "from_events": True}


def _summary_from_events(path: Path, stamp: Path) -> dict[str, Any] | None:
    """The runtime's summary of a launcher that died before writing its own (its node
    went, SIGKILL), from the event log it wrote as it ran: this attempt's (written since
    the stamp), whole (under the size limit), else None. Its figures are the job's word
    as the summary's are, bounded by the server's span where they are read."""
    found = stat_job_file(path)
    if found is None or found.st_size > SUMMARY_LIMIT_BYTES:
        return None
    with contextlib.suppress(OSError):
        if found.st_mtime_ns < stamp.stat().st_mtime_ns:
            return None  # an earlier attempt's
    return parsed(path, _events_summary, SUMMARY_LIMIT_BYTES)


def _events_summary(text: str | None) -> dict[str, Any] | None:
    events = parse_events(text or "")
    try:
        return summarize(events) if events else None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None  # not the runtime's events: no figures


def _summary_json(text: str | None) -> dict[str, Any] | None:
    try:
        data = loads_job_json(text or "")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_exit_ahead(run_dir: Path, node_ranks: int) -> None:
    """Parse, in the calling (worker) thread, what `settle_summary` of an attempt that
    ran on `node_ranks` nodes will read: each node rank's summary.json and, where that
    is not final, its event log (`argosy.server.read_ahead`)."""
    for directory in [run_dir, *(run_dir / f"node{i}" for i in range(1, node_ranks))]:
        summary = read_ahead(directory / "summary.json", _summary_json, SUMMARY_LIMIT_BYTES)
        if summary is None or summary.get("status") == "running":  # its launcher died
            read_ahead(directory / EVENTS_FILE, _events_summary, SUMMARY_LIMIT_BYTES)


NODE_ROW_KEYS = ("status", "final_step", "effective_training_time", "restarts")
FIGURES = {"effective_training_time": (0.0, 1.0), "final_step": (0, None), "restarts": (0, None)}
"""The runtime's figures that fleet views average or show as numbers, with their range:
a job's summary that gives one of another type or out of range has it set to None and
named in `refused`, so no job's word moves the fleet's mean past what can be true."""


def _checked(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` with each of `FIGURES` a number in its range, or None (and named)."""
    refused = [
        key
        for key, (low, high) in FIGURES.items()
        if summary.get(key) is not None and number(summary[key], low, high) is None
    ]
    if not refused:
        return summary
    return summary | dict.fromkeys(refused) | {"refused": refused}


def _node_row(rank: int, node: str, summary: dict[str, Any]) -> dict[str, Any]:
    """One node rank's line of a multi-node summary."""
    row: dict[str, Any] = {"node_rank": rank, "node": node}
    row |= {key: summary.get(key) for key in NODE_ROW_KEYS}
    lost = summary.get("lost_s")
    seconds = [number(v, low=0) for v in lost.values()] if isinstance(lost, dict) else []
    row["lost_s"] = round(sum(s for s in seconds if s is not None), 3) if seconds else None
    faults = summary.get("faults")
    row["faults"] = len(faults) if isinstance(faults, list) else None
    return row | node_energy(summary)  # wall_s, energy_j, productive_j, energy_detail


def exit_time(run_dir: Path, attempt: int, now_s: float) -> float:
    """When attempt `attempt` ended: the time its exit status was recorded (the mtime of
    `exit.code`, which the local executor's wrapper writes as the launcher exits), so a
    job that ended while the server was down is not stamped with the restart time. Kept
    within the attempt's start stamp and `now_s`; `now_s` when there is no record."""
    where = attempt_dir(run_dir, attempt)
    try:
        ended_s = (where / EXIT_RECORD).stat().st_mtime
    except OSError:
        return now_s
    with contextlib.suppress(OSError):  # no stamp: nothing to keep it after
        ended_s = max(ended_s, (where / STAMP).stat().st_mtime)
    return min(ended_s, now_s)


def attempt_started(run_dir: Path, attempt: int) -> float | None:
    """When attempt `attempt` started by its stamp (Unix seconds), None without one."""
    try:
        return (attempt_dir(run_dir, attempt) / STAMP).stat().st_mtime
    except OSError:
        return None


def _final_summary_since(path: Path, stamp: Path) -> dict[str, Any] | None:
    try:
        if stamp.exists() and path.stat().st_mtime_ns < stamp.stat().st_mtime_ns:
            return None  # an earlier attempt's
        data = parsed(path, _summary_json, SUMMARY_LIMIT_BYTES)
    except OSError:
        return None
    if data is None or data.get("status") == "running":
        return None  # the launcher died before writing its final summary
    return data
