"""Energy accounting of a run: the meter's trace charged to goodput's time buckets.

The launcher samples every device of its node (`hardware.energy.EnergyMeter`) and appends
each sample to `energy.jsonl` in the run directory: a header line
`{"devices": {device: method}, "unavailable": {reader: why}, "interval_s": s}`, then one line
every `energy_log_interval_s` (and at the first and last sample) `{"t": s since launch,
"d": {device: [joules since the meter started, highest watts since the previous line]}}`.
Pure: `energy_summary(events, trace, work)` reads those and returns summary.json's `energy`:

- devices: per device, its method (counter, integrated, not measured), joules, average
  watts (joules / seconds metered) and peak watts (highest sampled draw, else the highest
  one-interval average of the counter);
- total_j: the measured devices' joules over the run (None when no device was measured);
- productive_j / lost_j: the same intervals goodput counts as productive and as lost by
  cause (`goodput.time_buckets`); each interval's joules are read off every device's
  cumulative trace (linear between samples); lost_j.other is the rest of total_j;
- joules_per_step = productive_j / steps kept (what one useful step cost);
  joules_per_step_all_in = total_j / steps kept (with the faults, startup and idle);
- tokens_per_joule / samples_per_joule = work per step (`hooks.Runtime.work_per_step`,
  `work.json`) x steps kept / total_j; None when the script did not say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from argosy.hardware.energy import NOT_MEASURED, DeviceTrace
from argosy.runtime.goodput import CAUSES, time_buckets

ENERGY_FILE = "energy.jsonl"
WORK_FILE = "work.json"


def read_trace(path: Path) -> tuple[dict[str, DeviceTrace], dict[str, str]]:
    """The traces of an energy.jsonl, and the readers that could not read (with why).
    A torn line (a launcher killed mid-write) is skipped."""
    traces: dict[str, DeviceTrace] = {}
    unavailable: dict[str, str] = {}
    if not path.exists():
        return traces, {"meter": f"no {path.name} (the launcher did not meter this run)"}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "devices" in record:
            traces = {d: DeviceTrace(d, m) for d, m in record["devices"].items()}
            unavailable = dict(record.get("unavailable") or {})
            continue
        for device, (joules, watts) in record.get("d", {}).items():
            trace = traces.get(device)
            if trace is not None and trace.method != NOT_MEASURED:
                trace.t_s.append(float(record["t"]))
                trace.energy_j.append(float(joules))
                trace.power_w.append(None if watts is None else float(watts))
    return traces, unavailable


def read_work(path: Path) -> dict[str, float]:
    """`work.json`'s tokens/samples per step ({} when absent or malformed)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    if not isinstance(data, dict):
        return {}
    keys = ("tokens_per_step", "samples_per_step")
    return {k: float(data[k]) for k in keys if isinstance(data.get(k), int | float)}


def energy_summary(
    events: list[dict[str, Any]],
    traces: dict[str, DeviceTrace],
    work: dict[str, float] | None = None,
    unavailable: dict[str, str] | None = None,
) -> dict[str, Any]:
    """summary.json's `energy` section; see the module docstring for each figure."""
    work = work or {}
    measured = {d: t for d, t in traces.items() if t.total_j is not None}
    devices = {d: t.summary() for d, t in sorted(traces.items())}
    base: dict[str, Any] = {"devices": devices, "not_measured": dict(unavailable or {})}
    if not measured:
        why = "; ".join(f"{k}: {v}" for k, v in sorted((unavailable or {}).items()))
        return base | {"measured": False, "reason": why or "no device reported energy or power"}
    buckets = time_buckets(events)
    steps = len(buckets["productive"])

    def joules(cause: str) -> float:
        return sum(_between(t, buckets[cause]) for t in measured.values())

    total = sum(t.total_j or 0.0 for t in measured.values())
    productive = joules("productive")
    lost = {cause: joules(cause) for cause in CAUSES[:-1]}
    lost["other"] = max(0.0, total - productive - sum(lost.values()))
    return base | {
        "measured": True,
        "total_j": round(total, 3),
        "productive_j": round(productive, 3),
        "lost_j": {k: round(v, 3) for k, v in lost.items()},
        "lost_share": round((total - productive) / total, 4) if total > 0 else None,
        "steps": steps,
        "joules_per_step": _per(productive, steps),
        "joules_per_step_all_in": _per(total, steps),
        "tokens_per_joule": _work_per_joule(work.get("tokens_per_step"), steps, total),
        "samples_per_joule": _work_per_joule(work.get("samples_per_step"), steps, total),
        "how": "per device: its energy counter where it has one, else integrated power "
        "samples; productive and lost joules over the goodput time buckets; per step and "
        "per token over the steps kept (all-in: the run's total joules)",
    }


def _between(trace: DeviceTrace, intervals: list[tuple[float, float]]) -> float:
    return sum(trace.between(a, b) or 0.0 for a, b in intervals)


def _per(joules: float, steps: int) -> float | None:
    return round(joules / steps, 4) if steps else None


def _work_per_joule(per_step: float | None, steps: int, total: float) -> float | None:
    if per_step is None or total <= 0:
        return None
    return round(per_step * steps / total, 6)
