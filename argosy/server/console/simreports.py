"""Simulator reports for the console: the JSON `argosy sim run --compare --json` prints
(or one run's report), kept as files in a directory (`$ARGOSY_HOME/sim-reports`).

    save_report(folder, "month.json", data, Owner("team-a", "token t1 (ci)", now))
    names = list_reports(folder)
    report = load_report(folder, "month.json")  # ReportError names what is wrong
    report_owner(folder, "month.json")          # Owner(queue="team-a", ...), None if absent

A report file is written to a temporary name and renamed into place, so a crash while
saving never leaves a half-written file that is later listed as a report. Who uploaded
it lives beside it in a small hidden sidecar, `.<name>.owner` (JSON, written the same
way, before the report); a report with no sidecar (copied into the folder by hand) is
an admin's. Who may overwrite whose report is the console's rule, not this module's.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from argosy.core.text import find_unencodable

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.json$")
MAX_REPORT_BYTES = 8 << 20
FACTORS = (
    "resource_utilization",
    "effective_training_time",
    "single_chip_efficiency",
    "parallel_scaling",
    "product",
)


class ReportError(ValueError):
    """The file is not a simulator report (the message says what is wrong)."""


@dataclass(frozen=True)
class Owner:
    """Who stored a report: a queue's token, or an admin (queue None)."""

    queue: str | None
    actor: str
    uploaded_at: float = 0.0


ADMIN_OWNER = Owner(None, "admin")
"""The owner of a report without a readable sidecar."""


@dataclass(frozen=True)
class Report:
    """One or more policies' runs over the same trace, and their ratios."""

    name: str
    runs: list[dict[str, Any]]
    ratios: dict[str, float]

    def chart_data(self) -> dict[str, Any]:
        """What the report page draws, as ordered lists (JSON objects lose their order in
        templates): factor values per policy, and median JCT per job class."""
        factors = []
        for f in FACTORS:
            values = [_factor(r, f) for r in self.runs]
            if any(v is not None for v in values):
                factors.append({"name": f.replace("_", " "), "values": values})
        classes = sorted({c for r in self.runs for c in (r.get("jct_s") or {})})
        jct = [{"name": c, "values": [_p50(r, c) for r in self.runs]} for c in classes]
        return {"policies": [r["policy"] for r in self.runs], "factors": factors, "jct": jct}


IDLE = ("allocated", "down", "hot_spares", "blocked_frag", "blocked_whole", "growth_held",
        "no_work")  # fmt: skip
BACKFILL = (
    ("reserved", "workloads reserved"),
    ("reserved_started", "of them started"),
    ("late_p50_s", "late vs promise, p50 (s)"),
    ("late_p90_s", "late vs promise, p90 (s)"),
    ("backfilled", "started ahead (end before)"),
    ("in_extra", "started in the extra"),
    ("refused", "shapes refused for run time"),
    ("lent_starts", "gangs on idle guarantees"),
)


def idle_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Share of owned device-time per category (`argosy.sim.idle`), one value per run
    (None where a run has no such split): where allocation went short, and why."""
    rows = []
    for k in IDLE:
        values = [_num(((r.get("idle") or {}).get("all") or {}).get(k)) for r in runs]
        if any(v is not None for v in values):
            rows.append({"name": k.replace("_", " "), "values": values})
    return rows


def backfill_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reservations, backfills, lent guarantees, the estimates' error and resize churn,
    one value per run (None where a run did not report it)."""
    rows = []
    for key, label in BACKFILL:
        rows.append({"name": label, "values": [_num((r.get("backfill") or {}).get(key))
                                               for r in runs]})  # fmt: skip
    for key, label in (("median_abs_error", "estimate error, median"),
                       ("p90_abs_error", "estimate error, p90")):  # fmt: skip
        rows.append(
            {
                "name": label,
                "values": [
                    _num(((r.get("backfill") or {}).get("estimates") or {}).get(key)) for r in runs
                ],
            }
        )
    for key, label in (("resizes_per_job_day", "resizes per elastic job-day"),
                       ("stall_share", "resize stalls, share of device-time")):  # fmt: skip
        rows.append({"name": label, "values": [_num((r.get("resize_churn") or {}).get(key))
                                               for r in runs]})  # fmt: skip
    return [row for row in rows if any(v is not None for v in row["values"])]


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def parse_report(name: str, data: Any) -> Report:
    if isinstance(data, dict) and "runs" in data:
        runs, ratios = data["runs"], data.get("ratios") or {}
    else:
        runs, ratios = [data], {}
    if not isinstance(runs, list) or not runs:
        raise ReportError("'runs' must be a non-empty list of reports")
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("policy"), str):
            raise ReportError(f"runs[{i}]: a report needs a 'policy' name")
        if not isinstance(run.get("five_factor"), dict):
            raise ReportError(f"runs[{i}] ({run['policy']}): missing 'five_factor'")
    if not isinstance(ratios, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in ratios.values()
    ):
        raise ReportError("'ratios' must map names to numbers")
    return Report(name, runs, {str(k): float(v) for k, v in ratios.items()})


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise ReportError(
            f"report name '{name}': use letters, digits, '.', '_', '-' and end in .json"
        )
    return name


def save_report(folder: Path, name: str, raw: bytes, owner: Owner | None = None) -> Report:
    """Validate `raw` as a report and store it as `folder/name` (atomically), with its
    owner's sidecar first when `owner` is given."""
    check_name(name)
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"report is {len(raw)} bytes; the limit is {MAX_REPORT_BYTES}")
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise ReportError(f"not JSON: {err}") from None
    except RecursionError:
        raise ReportError("JSON nested too deeply to read") from None
    where = find_unencodable(data)
    if where is not None:  # stored, the report's page could never be written out
        field = ".".join(map(str, where))
        raise ReportError(f"'{field}' holds a lone surrogate escape (such as \\udc80)")
    report = parse_report(name, data)
    folder.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        stamped = Owner(owner.queue, owner.actor, owner.uploaded_at or time.time())
        write_atomically(owner_path(folder, name), json.dumps(asdict(stamped)).encode())
    write_atomically(folder / name, raw)
    return report


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync it, and rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def owner_path(folder: Path, name: str) -> Path:
    return folder / f".{check_name(name)}.owner"


def report_owner(folder: Path, name: str) -> Owner | None:
    """Who stored report `name`; None when there is no such report. A report without a
    readable sidecar is an admin's (ADMIN_OWNER)."""
    if not (folder / check_name(name)).is_file():
        return None
    try:
        data = json.loads(owner_path(folder, name).read_text())
        owner = Owner(data["queue"], data["actor"], float(data.get("uploaded_at") or 0.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ADMIN_OWNER
    if not (owner.queue is None or isinstance(owner.queue, str)):
        return ADMIN_OWNER
    return owner


def list_reports(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.glob("*.json") if NAME.match(p.name))


def load_report(folder: Path, name: str) -> Report:
    path = folder / check_name(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(list_reports(folder)) or "none"
        raise ReportError(f"no report '{name}'; known: {known}") from None
    except (OSError, ValueError) as err:
        raise ReportError(f"{name}: cannot read: {err}") from None
    return parse_report(name, data)


def _factor(run: dict[str, Any], key: str) -> float | None:
    value = (run.get("five_factor") or {}).get(key)
    if isinstance(value, dict):
        value = value.get("value")
    return float(value) if isinstance(value, int | float) else None


def _p50(run: dict[str, Any], cls: str) -> float | None:
    value = ((run.get("jct_s") or {}).get(cls) or {}).get("p50")
    return float(value) if isinstance(value, int | float) else None
