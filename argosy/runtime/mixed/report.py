"""Throughput accounting of a mixed-chip run: measured vs the planner, per group. Pure
apart from `write_throughput` / `read_throughput`.

Every rank records, per step, its compute time (its micro-batches' forward and backward,
emulation sleep included: the time its chip would be busy), the time it blocked at the
cross-group all-reduce, and the step's end time. Rank 0 gathers the records and
`throughput_summary` turns them into summary.json's `throughput`:

- measured_samples_per_s: global batch x measured steps / (last step end - end of the
  first measured step), over the last attempt's steps after `warmup` steps.
- by_group: per chip group, samples per step (in the last step: a rebalance may have
  moved them), median busy time per step (the slowest rank of the group),
  solo_samples_per_s = median over steps of samples / busy time (what the group would do
  alone at this speed, never waiting), and median wait per step.
- shares (added by `rank.MixedRank.finish`): the planned group shares, those in use at
  the end, and every change the rebalance made (step, from, to, measured s/sample).
- efficiency_vs_solo_sum: measured / sum of the groups' solo throughputs.
- emulation_overrun_s_per_step: on emulated runs, time past the emulation's deadlines
  (real compute that did not fit, sleep overshoot), the busiest rank's, per step: the
  emulation's own overhead; real_compute_share_of_busy: real compute / emulated busy time.
- cross_group_wait_s: time blocked at the cross-group all-reduce, summed over measured
  steps (mean over ranks), and per step; lost_s_per_step splits a step's loss against
  the busiest rank into imbalance (busiest - mean busy) and sync (step - busiest).
- predicted_samples_per_s: the planner's throughput for this plan, scaled to the run:
  planner rate x (measured solo rate / planner rate) of the reference group (the fastest
  chip's group; on an emulated run, the fastest emulated one). One scale for the whole plan,
  so what is compared is the planner's *split*, not its absolute speed of the chips.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

THROUGHPUT_FILE = "mixed/throughput.json"
RECORDS_FILE = "records.json"


def throughput_summary(
    doc: dict[str, Any], records: list[list[dict[str, float]]], warmup: int = 2
) -> dict[str, Any]:
    """`doc`: the launch's assignment document; `records[rank]`: that rank's step records
    ({step, compute_s, wait_s, end_s, overrun_s, real_compute_s})."""
    layout, ranks = doc["layout"], doc["ranks"]
    steps = sorted({int(r["step"]) for r in records[0]})[warmup:]
    if len(steps) < 2:
        return {"how": "too few steps to measure (need warmup + 2)"}
    first, last = steps[0], steps[-1]
    ends = {int(r["step"]): r["end_s"] for r in records[0]}
    wall = ends[last] - ends[first]
    measured = layout["global_batch"] * (last - first) / wall if wall > 0 else 0.0
    kept = [[r for r in rank if first < int(r["step"]) <= last] for rank in records]
    groups = _by_group(layout, ranks, kept)
    solo_sum = sum(g["solo_samples_per_s"] for g in groups)
    ref = _reference_group(layout, ranks, doc.get("emulation"))
    planned = layout["predicted_step_s"] > 0  # a run without a plan has no prediction
    planner_rate = layout["global_batch"] / layout["predicted_step_s"] if planned else 0.0
    ref_group = layout["groups"][ref]
    planned_ref = ref_group["samples"] / ref_group["predicted_step_s"] if planned else 0.0
    scale = groups[ref]["solo_samples_per_s"] / planned_ref if planned_ref else 0.0
    waits = [sum(r["wait_s"] for r in rank) for rank in kept]
    overrun = [sum(r.get("overrun_s", 0.0) for r in rank) for rank in kept]
    real = sum(r.get("real_compute_s", 0.0) for rank in kept for r in rank)
    busy = sum(r["compute_s"] for rank in kept for r in rank)
    return {
        "measured_samples_per_s": round(measured, 3),
        "predicted_samples_per_s": round(planner_rate * scale, 3) if planned else None,
        "planner_samples_per_s_real_chips": round(planner_rate, 3) if planned else None,
        "prediction_scale": round(scale, 6),
        "by_group": groups,
        "solo_sum_samples_per_s": round(solo_sum, 3),
        "efficiency_vs_solo_sum": round(measured / solo_sum, 4) if solo_sum else 0.0,
        "cross_group_wait_s": round(statistics.fmean(waits), 4),
        "cross_group_wait_s_per_step": round(statistics.fmean(waits) / len(kept[0]), 5),
        "measured_steps": last - first,
        "emulated": doc.get("emulation"),
        "emulation_overrun_s_per_step": round(max(overrun) / len(kept[0]), 6),
        "real_compute_share_of_busy": round(real / busy, 4) if busy else 0.0,
        "lost_s_per_step": _lost_per_step(kept, ends, first),
        "how": "argosy.runtime.mixed.report (module docstring): measured over the last "
        f"attempt's steps {first + 1}..{last}; predicted = planner rate scaled by the "
        f"reference group {ref}'s measured/planned solo rate",
    }


def _lost_per_step(kept: list[list[dict]], ends: dict[int, float], first: int) -> dict:
    """Medians over steps: imbalance = slowest rank's busy time - mean busy time (ranks
    that finished early, by plan or by jitter); sync = step time - slowest busy time (the
    all-reduce not hidden, the optimizer, the loss reduction)."""
    imbalance, sync = [], []
    for i, record in enumerate(kept[0]):
        step = int(record["step"])
        busy = [rank[i]["compute_s"] for rank in kept]
        duration = ends[step] - ends.get(step - 1, ends[first])
        imbalance.append(max(busy) - statistics.fmean(busy))
        sync.append(duration - max(busy))
    return {
        "imbalance": round(statistics.median(imbalance), 5),
        "sync": round(statistics.median(sync), 5),
    }


def _by_group(layout: dict, ranks: list[dict], kept: list[list[dict]]) -> list[dict[str, Any]]:
    out = []
    for index, group in enumerate(layout["groups"]):
        members = [r["rank"] for r in ranks if r["group"] == index]
        busy = [max(kept[m][i]["compute_s"] for m in members) for i in range(len(kept[0]))]
        wait = [statistics.fmean(kept[m][i]["wait_s"] for m in members) for i in range(len(busy))]
        samples = [_group_samples(kept, members, i, group["samples"]) for i in range(len(busy))]
        busy_s = statistics.median(busy)
        rates = [n / b for n, b in zip(samples, busy, strict=True) if b > 0]
        solo = statistics.median(rates) if rates else 0.0
        out.append(
            {
                "group": index,
                "chip": group["chip"],
                "devices": group["devices"],
                "samples_per_step": samples[-1],
                "busy_s_per_step": round(busy_s, 5),
                "solo_samples_per_s": round(solo, 3),
                "wait_s_per_step": round(statistics.median(wait), 5),
                "planned_samples_per_s": round(group["samples"] / group["predicted_step_s"], 3)
                if group["predicted_step_s"] > 0
                else None,
            }
        )
    return out


def _group_samples(kept: list[list[dict]], members: list[int], step: int, planned: int) -> int:
    """The group's samples in measured step `step` (records without them: the plan's)."""
    if "samples" not in kept[members[0]][step]:
        return planned
    return sum(int(kept[m][step]["samples"]) for m in members)


def _reference_group(layout: dict, ranks: list[dict], emulation: dict | None) -> int:
    """The group the prediction is scaled by: the unthrottled (fastest) chip's."""
    if emulation:
        speeds = emulation["relative_speed"]  # the fastest emulated rank's group
        best = max(range(len(ranks)), key=lambda r: speeds[r])
        return int(ranks[best]["group"])
    if layout["predicted_step_s"] <= 0:  # no plan: a uniform run, any group will do
        return 0
    rates = [g["samples"] / g["predicted_step_s"] / g["devices"] for g in layout["groups"]]
    return max(range(len(rates)), key=rates.__getitem__)


def write_throughput(
    run_dir: Path, summary: dict[str, Any], records: list[list[dict[str, float]]] | None = None
) -> Path:
    """`mixed/throughput.json` and, when given, every rank's step records
    (`mixed/records.json`, for analysis)."""
    from argosy.runtime.events import write_json_atomic

    path = run_dir / THROUGHPUT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, summary)
    if records is not None:
        write_json_atomic(path.with_name(RECORDS_FILE), {"ranks": records})
    return path


def read_throughput(run_dir: Path) -> dict[str, Any] | None:
    """The run's throughput section, when the ranks wrote one (mixed launches)."""
    path = run_dir / THROUGHPUT_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
