"""What must hold between any two scheduler steps, as a list of broken rules.

    problems = violations(sched)     # [] when the state is consistent

Checked: no device in two allocations; free counts, histograms and per-group totals of
`Capacity` agree with the allocations; hot spares are whole, up and idle; nothing runs
on a down node; every gang is whole (min <= devices <= its most, `growth.max_size`) on
one group of its chip, with its per-node shape where it has one;
queue usage equals what its workloads hold, and never exceeds an explicit ceiling.
After a cycle (`spares_short`): under a policy with hot spares every group holds its
spare target (at least one in a group of two nodes or more) unless it has no whole idle
node left to hold.
Costs O(nodes + allocations): for tests and `SimConfig.check_invariants`, not a hot path.
"""

from __future__ import annotations

import numpy as np

from argosy.scheduler.capacity import Capacity
from argosy.scheduler.growth import max_size


def violations(sched) -> list[str]:  # noqa: ANN001  # a Scheduler (no import cycle)
    """Every broken rule, as a readable line; empty when all hold."""
    cap: Capacity = sched.cap
    used = np.zeros(len(cap.cap), dtype=np.int64)
    usage = np.zeros_like(sched.tree.usage)
    out: list[str] = []
    for w in sched.running.values():
        out += _gang(cap, w, max_size(sched, w))
        if w.alloc is not None:
            np.add.at(used, w.alloc.nodes, w.alloc.counts)
            _charge(sched.tree, usage, w.queue, w.chip, w.alloc.devices)
    for s in sched.services:
        for chunk in s.replicas:
            np.add.at(used, chunk.nodes, chunk.counts)
            _charge(sched.tree, usage, s.queue, cap.chips[chunk.group], chunk.devices)
    out += _devices(cap, used)
    out += _groups(cap)
    out += _queues(sched.tree, usage)
    return out


def spares_short(sched) -> list[str]:  # noqa: ANN001  # a Scheduler
    """Groups holding fewer hot spares than their target while a whole node sits idle
    (holds right after a cycle; a fault in between may use a spare up)."""
    if not sched.policy.hot_spares:
        return []
    cap: Capacity = sched.cap
    return [
        f"group {g}: {cap.spare_count[g]} spares < target {sched.spare_target(g)} with "
        f"{cap.whole_free_nodes(g)} whole nodes idle"
        for g in range(len(cap.ranges))
        if cap.spare_count[g] < sched.spare_target(g) and cap.whole_free_nodes(g) > 0
    ]


def _charge(tree, usage: np.ndarray, queue: str, chip: str | None, devices: int) -> None:
    if chip is not None:
        usage[tree.ancestors[queue], tree.chip_index[chip]] += devices


def _gang(cap: Capacity, w, most: int) -> list[str]:  # noqa: ANN001
    a = w.alloc
    if a is None:
        return [f"{w.id} runs without an allocation"]
    out = []
    if not w.min_devices <= a.devices <= most:
        out.append(f"{w.id} holds {a.devices} devices outside [{w.min_devices}, {most}]")
    if len(np.unique(a.nodes)) != len(a.nodes) or (a.counts <= 0).any():
        out.append(f"{w.id} lists a node twice or with no device")
    if (cap.group[a.nodes] != a.group).any():
        out.append(f"{w.id} holds nodes outside its group {a.group}")
    if w.per_node and (a.counts != w.per_node).any():
        out.append(f"{w.id} asks {w.per_node} devices per node, holds {a.counts.tolist()}")
    if cap.chips[a.group] != w.chip:
        out.append(f"{w.id} runs on group {a.group} ({cap.chips[a.group]}), not on {w.chip}")
    return out


def _devices(cap: Capacity, used: np.ndarray) -> list[str]:
    out = []
    if (over := np.flatnonzero(used > cap.cap)).size:
        out.append(f"devices allocated twice on nodes {over[:5].tolist()}")
    live = cap.up & ~cap.spare
    if (bad := np.flatnonzero(live & (cap.avail + used != cap.cap))).size:
        out.append(f"free count out of step on nodes {bad[:5].tolist()}")
    if (bad := np.flatnonzero(~live & ((cap.avail != 0) | (used != 0)))).size:
        out.append(f"work or free devices on down or spare nodes {bad[:5].tolist()}")
    if (bad := np.flatnonzero(cap.spare & ~cap.up)).size:
        out.append(f"spares that are down: {bad[:5].tolist()}")
    return out


def _groups(cap: Capacity) -> list[str]:
    out = []
    for g, (s, e) in enumerate(cap.ranges):
        if (cap.group[s:e] != g).any():
            out.append(f"group {g}: node range [{s}, {e}) holds nodes of another group")
        avail = cap.avail[s:e]
        want = np.bincount(avail, minlength=cap.hist.shape[1])
        if not np.array_equal(want, cap.hist[g]):
            out.append(f"group {g}: free-count histogram out of step")
        if int(avail.sum()) != int(cap.free_devices[g]):
            out.append(f"group {g}: free devices {cap.free_devices[g]} != {int(avail.sum())}")
        if int(cap.spare[s:e].sum()) != int(cap.spare_count[g]):
            out.append(f"group {g}: spare count {cap.spare_count[g]} out of step")
    return out


def _queues(tree, usage: np.ndarray) -> list[str]:
    out = []
    if not np.array_equal(usage, tree.usage):
        bad = np.argwhere(usage != tree.usage)[:3].tolist()
        out.append(f"queue usage out of step at [queue, chip] {bad}")
    binding = tree.ceiling < tree.totals[None, :]
    if (tree.usage[binding] > tree.ceiling[binding]).any():
        out.append("queue usage above an explicit ceiling")
    return out
