"""A PNG of allocation over time by workload kind, one panel per policy (matplotlib,
Agg backend, imported only here)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from argosy.scheduler.workload import KINDS

COLORS = {"train": "#1f77b4", "finetune": "#2ca02c", "eval": "#ff7f0e", "debug": "#d62728",
          "infer": "#9467bd"}  # fmt: skip


def plot_allocation(runs: list[dict], capacity: int, path: Path) -> Path:
    """Stacked allocated devices by kind over days; written atomically to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.6 * len(runs)), sharex=True,
                             squeeze=False)  # fmt: skip
    for ax, run in zip(axes[:, 0], runs, strict=True):
        t = np.asarray(run["_samples_t"]) / 86400
        series = np.asarray(run["_samples"]).T
        ax.stackplot(t, series, labels=KINDS, colors=[COLORS[k] for k in KINDS], alpha=0.85)
        ax.axhline(capacity, color="black", lw=0.8, ls="--")
        ax.set_ylim(0, capacity * 1.05)
        ax.set_ylabel("devices")
        ax.set_title(
            f"{run['policy']}: allocation {run['allocation_rate']:.1%}, "
            f"useful {run['useful_rate']:.1%}, SLO {run['slo_attainment']:.1%}",
            fontsize=10,
        )
    axes[0, 0].legend(loc="lower right", ncol=len(KINDS), fontsize=8)
    axes[-1, 0].set_xlabel("day")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
