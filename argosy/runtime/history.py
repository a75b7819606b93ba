"""A run directory's history: launching again into it archives the previous run first.

The top of a run directory always holds the latest run (events.jsonl, summary.json,
logs/, stacks/, resume/, node_health.json, timeline.png, energy.jsonl, work.json), so every
reader of those files sees one run, never a mix. Before a new run starts,
`archive_previous` moves the earlier run's files to `history/<NNN>-<run id>/`; checkpoints
stay where they are, so the new run resumes from them. A run whose launcher still runs is
never moved: that is refused.
`argosy launch` archives before it writes anything for the new run (a mixed-chip
assignment, say); `Agent.run` archives too, a no-op when that was done.

    archived = archive_previous(run_dir)     # None when the directory held no run
    earlier = list_history(run_dir)          # oldest first: {"path", "run_id", "status", ...}
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.core.procs import pid_alive
from argosy.runtime.events import EVENTS_FILE, SUMMARY_FILE, read_events

HISTORY_DIR = "history"
NODE_HEALTH_FILE = "node_health.json"
RUN_FILES = (
    EVENTS_FILE,
    SUMMARY_FILE,
    NODE_HEALTH_FILE,
    "timeline.png",
    "logs",
    "stacks",
    "resume",
    "mixed/throughput.json",  # a mixed-chip run's figures (argosy.runtime.mixed.report)
    "energy.jsonl",  # the launcher's energy samples (argosy.runtime.energy)
    "work.json",  # tokens/samples per step, from the script (hooks.work_per_step)
)
"""What belongs to one run; everything else in the directory (checkpoints) is shared."""


class RunDirBusyError(ArgosyError):
    """The run directory belongs to a launcher that is still running."""


def start_of(events_path: Path) -> dict[str, Any]:
    """The first `start` event of a log ({} when there is none)."""
    try:
        events = read_events(events_path)
    except OSError:
        return {}
    return next((e for e in events if e["event"] == "start"), {})


def archive_previous(run_dir: Path) -> Path | None:
    """Move the previous run's files under history/; None when there was no run."""
    events = run_dir / EVENTS_FILE
    if not events.exists():
        return None
    check_not_busy(run_dir)
    start = start_of(events)
    history = run_dir / HISTORY_DIR
    history.mkdir(exist_ok=True)
    number = len([p for p in history.iterdir() if p.is_dir()]) + 1
    target = history / f"{number:03d}-{start.get('run_id') or 'unknown'}"
    target.mkdir()
    for name in RUN_FILES:
        if (run_dir / name).exists():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(run_dir / name, target / name)
    return target


def check_not_busy(run_dir: Path) -> None:
    """Raise RunDirBusyError when the directory's run has a launcher that still runs."""
    events = run_dir / EVENTS_FILE
    if not events.exists():
        return
    pid = start_of(events).get("launcher_pid")
    if isinstance(pid, int) and pid_alive(pid) and not _ended(events):
        raise RunDirBusyError(
            f"run directory {run_dir} is in use by a running launcher (pid {pid}); "
            "pick another --run-dir or stop that launcher first"
        )


def _ended(events_path: Path) -> bool:
    return any(e["event"] == "end" for e in read_events(events_path))


def list_history(run_dir: Path) -> list[dict[str, Any]]:
    """Earlier runs of the directory, oldest first, with their status and last step."""
    history = run_dir / HISTORY_DIR
    if not history.is_dir():
        return []
    out = []
    for path in sorted(p for p in history.iterdir() if p.is_dir()):
        summary = _read_json(path / SUMMARY_FILE)
        start = start_of(path / EVENTS_FILE)
        out.append(
            {
                "path": str(path),
                "run_id": start.get("run_id"),
                "started": start.get("wall"),
                "status": summary.get("status", "unknown"),
                "final_step": summary.get("final_step"),
                "restarts": summary.get("restarts"),
            }
        )
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
