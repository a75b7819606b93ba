"""Presenter of a mixed-chip run's throughput (summary.json `throughput`) for `runs show`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_throughput(console: Console, throughput: dict[str, Any] | None) -> None:
    """Overall measured vs predicted, efficiency vs solo sum, then one row per chip group."""
    if not throughput or "measured_samples_per_s" not in throughput:
        return
    t = throughput
    head = Table(title="throughput (mixed-chip plan)", show_header=False)
    predicted = t.get("predicted_samples_per_s")
    head.add_row("measured", f"{t['measured_samples_per_s']:.2f} samples/s")
    if predicted:
        ratio = t["measured_samples_per_s"] / predicted
        head.add_row("predicted (planner, scaled)", f"{predicted:.2f} samples/s ({ratio:.2f}x)")
    head.add_row("sum of groups' solo", f"{t['solo_sum_samples_per_s']:.2f} samples/s")
    head.add_row("efficiency vs solo sum", f"{t['efficiency_vs_solo_sum']:.1%}")
    head.add_row(
        "waiting at cross-group all-reduce",
        f"{t['cross_group_wait_s']:.2f} s ({t['cross_group_wait_s_per_step'] * 1e3:.1f} ms/step)",
    )
    shares = t.get("shares")
    if shares:
        head.add_row("batch shares, planned -> used", _shares(shares))
    console.print(head)
    groups = Table(title="by chip group")
    for column in ("group", "chip", "devices", "samples/step", "busy s/step", "solo samples/s"):
        groups.add_column(column)
    groups.add_column("wait s/step")
    for g in t["by_group"]:
        groups.add_row(
            str(g["group"]),
            g["chip"],
            str(g["devices"]),
            str(g["samples_per_step"]),
            f"{g['busy_s_per_step']:.4f}",
            f"{g['solo_samples_per_s']:.2f}",
            f"{g['wait_s_per_step']:.4f}",
        )
    console.print(groups)
    emulated = t.get("emulated")
    if emulated:
        console.print(
            f"{emulated['note']}; emulation overrun "
            f"{t.get('emulation_overrun_s_per_step', 0.0) * 1e3:.2f} ms/step, real compute "
            f"{t.get('real_compute_share_of_busy', 0.0):.0%} of busy time",
            highlight=False,
            markup=False,
        )
    console.print(f"how: {t['how']}", highlight=False, markup=False)


def _shares(shares: dict[str, Any]) -> str:
    """'21/15 -> 22/14 (rebalanced at step 3: 21/15 -> 22/14)'; '... (not rebalanced)' where
    the policy did not apply (--no-rebalance, one chip group, or a layer split)."""
    text = "/".join(map(str, shares["planned"])) + " -> " + "/".join(map(str, shares["used"]))
    if shares.get("rebalance") is None:
        return f"{text} (not rebalanced)"
    moves = "; ".join(
        f"step {c['step']}: {'/'.join(map(str, c['from']))} -> {'/'.join(map(str, c['to']))}"
        for c in shares["changes"]
    )
    return f"{text} (rebalanced at {moves})" if moves else f"{text} (no change needed)"
