"""Mixed-chip plans: non-uniform batch splits across chip groups, each planned on its own.

Each chip group runs its own replicas with its own TP/PP/micro-batch/recompute/ZeRO (the
plan that is fastest for that chip and its memory), and takes a share of the global batch
that is a multiple of its data-parallel degree (every replica gets the same sequences),
proportional to its predicted throughput; shares are rebalanced until the groups' step
times agree. Gradients are then all-reduced across groups, priced on the slowest NIC
the traffic crosses (groups never share a leaf switch), and hidden behind the backward
of the last micro-batch as far as the group's own data-parallel traffic leaves room.

    split = plan_mixed(model, cluster, seq_len=4096, global_batch=1536)
    split.step_s, split.shares, split.efficiency
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from argosy.hardware.cluster import Cluster, NodeGroup
from argosy.planner.efficiency import Constants, default_constants
from argosy.planner.models import ModelSpec
from argosy.planner.search import Ranked, search_group

ROUNDS = 4


@dataclass
class GroupPlan:
    """One chip group's part of a mixed plan."""

    group: NodeGroup
    samples: int
    ranked: Ranked

    @property
    def step_s(self) -> float:
        return self.ranked.step_s(0) if len(self.ranked) else float("inf")


@dataclass
class MixedPlan:
    """Per-group plans, the cross-group gradient time and the resulting step time."""

    parts: list[GroupPlan]
    exposed_sync_s: list[float]
    sync_traffic_s: float
    candidates: int

    @property
    def step_s(self) -> float:
        pairs = zip(self.parts, self.exposed_sync_s, strict=True)
        return max(p.step_s + e for p, e in pairs if p.samples)

    @property
    def sync_s(self) -> float:
        """Step time added by the cross-group gradient all-reduce."""
        return self.step_s - max(p.step_s for p in self.parts if p.samples)

    @property
    def feasible(self) -> bool:
        return all(len(p.ranked) for p in self.parts if p.samples)

    def efficiency(self) -> float:
        """Throughput over the sum of each group's throughput planned alone on its share."""
        alone = sum(p.samples / p.step_s for p in self.parts if p.samples)
        total = sum(p.samples for p in self.parts)
        return (total / self.step_s) / alone if alone else 0.0


def plan_mixed(
    model: ModelSpec,
    cluster: Cluster,
    seq_len: int,
    global_batch: int,
    constants: Constants | None = None,
    progress: Callable[[int], None] | None = None,
    framework=None,
) -> MixedPlan:
    """Split `global_batch` across the chip groups of `cluster` and plan each group."""
    groups = list(cluster.groups)
    weights = np.array([g.chip.peak_tflops("bf16") * g.num_devices for g in groups], dtype=float)
    # every group of a batch split runs (a group left out would hold devices the launch
    # must still start); `argosy launch --plan` then gives each rank a sequence
    floors = np.ones(len(groups), dtype=int) if global_batch >= len(groups) else None
    shares = _round_shares(weights, global_batch, floors)
    parts: list[GroupPlan] = []
    candidates = 0
    for _ in range(ROUNDS):
        parts = [
            _plan_part(model, g, seq_len, int(s), constants, framework)
            for g, s in zip(groups, shares, strict=True)
        ]
        candidates += sum(len(p.ranked.cands) for p in parts)
        if progress:
            progress(len(groups))
        rates = np.array(
            [p.samples / p.step_s if p.samples and np.isfinite(p.step_s) else 0.0 for p in parts]
        )
        if rates.sum() == 0:
            break
        # a group whose share has no even layout keeps a peak-proportional rate
        per_peak = np.median(rates[rates > 0] / weights[rates > 0])
        new = _round_shares(np.where(rates > 0, rates, weights * per_peak), global_batch, floors)
        if np.array_equal(new, shares):
            break
        shares = new
    parts, extra = _refine(model, parts, seq_len, constants, framework)
    traffic = _sync_traffic_s(model, parts, constants)
    exposed = [_sync_exposed_s(p, t, constants) for p, t in zip(parts, traffic, strict=True)]
    return MixedPlan(parts, exposed, max(traffic), candidates + extra)


def _refine(model, parts: list[GroupPlan], seq_len, constants, framework=None, moves: int = 12):
    """Move samples off the slowest group while its step time drops: integer micro-batches
    leave the proportional split uneven. Tries a few move sizes towards every other group
    (never the slow group's last sample)."""
    cache: dict[tuple[int, int], GroupPlan] = {(p.group.index, p.samples): p for p in parts}

    def part(group, samples: int) -> GroupPlan:
        key = (group.index, samples)
        if key not in cache:
            cache[key] = _plan_part(model, group, seq_len, samples, constants, framework)
        return cache[key]

    for _ in range(moves):
        slow = max(parts, key=lambda p: p.step_s)
        best, best_step = None, slow.step_s
        for other in parts:
            if other is slow:
                continue
            for delta in _move_sizes(slow):
                if delta >= slow.samples:
                    break
                a, b = (
                    part(slow.group, slow.samples - delta),
                    part(other.group, other.samples + delta),
                )
                rest = max(
                    (p.step_s for p in parts if p is not slow and p is not other), default=0.0
                )
                step = max(a.step_s, b.step_s, rest)
                if step < best_step * (1 - 1e-9):
                    best, best_step = (slow, a, other, b), step
        if best is None:
            break
        slow, a, other, b = best
        parts = [a if p is slow else b if p is other else p for p in parts]
    searched = sum(len(p.ranked.cands) for p in cache.values())
    return parts, searched


def _move_sizes(slow: GroupPlan) -> list[int]:
    """Samples to try moving off the slow group: small steps, and one or two of its
    plan's micro-batch rounds (dp x mbs), the step that keeps its layout whole."""
    sizes = {1, 2, 4, 8, 16, 32}
    if len(slow.ranked):
        plan = slow.ranked.plan(0)
        sizes |= {plan.dp * plan.mbs, 2 * plan.dp * plan.mbs}
    return sorted(sizes)


def _plan_part(model, group, seq_len, samples, constants, framework=None) -> GroupPlan:
    kwargs = {"exact_batch": False, "constants": constants, "framework": framework}
    if samples == 0:
        return GroupPlan(group, 0, search_group(model, group, seq_len, 1, **kwargs))
    ranked = search_group(model, group, seq_len, samples, **kwargs)
    # every replica of the group takes the same number of sequences
    even = ranked.order[samples % ranked.cands.dp[ranked.order] == 0]
    return GroupPlan(group, samples, replace(ranked, order=even))


def _round_shares(weights: np.ndarray, total: int, floors: np.ndarray | None = None) -> np.ndarray:
    """Integer shares of `total` proportional to `weights` (largest remainders); where one
    falls below its floor, every group gets its floor and the rest is split so."""
    shares = _proportional(weights, total)
    if floors is not None and np.any(shares < floors):
        shares = floors + _proportional(weights, total - int(floors.sum()))
    return shares


def _proportional(weights: np.ndarray, total: int) -> np.ndarray:
    raw = weights / weights.sum() * total
    shares = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - shares))[: total - shares.sum()]:
        shares[i] += 1
    return shares


def _sync_traffic_s(
    model: ModelSpec, parts: list[GroupPlan], constants: Constants | None
) -> list[float]:
    """Seconds each group's devices spend all-reducing their gradient shard with the other
    groups, over the slowest NIC the traffic crosses (groups meet above their leaves)."""
    active = [p for p in parts if p.samples]
    if len(active) < 2:
        return [0.0 for _ in parts]
    consts = constants or default_constants()
    nic = min(p.group.nic_gbps for p in active) * 1e9 / 8
    eff = min(consts.chip(p.group.chip.id).nic_eff for p in active)
    grad = model.total_params() * consts.framework.grad_bytes
    g = len(active)
    return [
        2.0 * (g - 1) / g * grad / p.group.num_devices / (nic * eff) if p.samples else 0.0
        for p in parts
    ]


def _sync_exposed_s(part: GroupPlan, traffic_s: float, constants: Constants | None) -> float:
    """What the backward of the group's last micro-batch cannot hide, after its own
    data-parallel traffic has used that window (the same overlap rule as plain DP)."""
    if traffic_s == 0.0 or not part.samples or not len(part.ranked):
        return 0.0
    fw = (constants or default_constants()).framework
    i, plan = part.ranked.index(0), part.ranked.plan(0)
    costs = part.ranked.costs
    nmb = max(1.0, np.ceil(part.samples / plan.dp / plan.mbs))
    window = fw.dp_overlap * float(costs.compute_s[i]) / nmb * 2.0 / 3.0
    slack = max(0.0, window - float(costs.dp_s[i]))
    return max(0.0, traffic_s - slack)
