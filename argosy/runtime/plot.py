"""The timeline plot of a run: progress (step) over time, faults and recoveries marked.

matplotlib (Agg) is imported inside `plot_timeline`, never at module import.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

COLORS = {"crash": "tab:red", "exit": "tab:orange", "hang": "tab:purple", "straggler": "tab:olive"}


def plot_timeline(events: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> Path:
    """Write a PNG of steps vs seconds since launch, one colour per attempt, faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    by_attempt: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for e in events:
        if e["event"] == "step":
            by_attempt[e["attempt"]].append((e["t"], e["step"]))
    for attempt, points in sorted(by_attempt.items()):
        ts, steps = zip(*points, strict=True)
        ax.plot(ts, steps, lw=1.5, label=f"attempt {attempt}")
    resumes = {e["attempt"]: e["t"] for e in events if e["event"] == "resume"}
    for fault in summary.get("faults", []):
        color = COLORS.get(fault["kind"], "black")
        ax.axvline(fault["detected_at_s"], color=color, ls="--", lw=1)
        if fault.get("injected_at_s") is not None:
            ax.axvline(fault["injected_at_s"], color=color, ls=":", lw=1)
        nxt = resumes.get(fault.get("attempt", -1) + 1)
        if nxt is not None and fault.get("resumed_from_step") is not None:
            ax.axvspan(fault["detected_at_s"], nxt, color=color, alpha=0.12)
        ax.text(
            fault["detected_at_s"],
            0,
            f" {fault['kind']} r{fault['rank']}",
            color=color,
            rotation=90,
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("step")
    ett = summary.get("effective_training_time", 0.0)
    ax.set_title(
        f"effective training time {ett:.1%}  (dotted: injected, dashed: detected, "
        "shaded: restart + reload)",
        fontsize=10,
    )
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
