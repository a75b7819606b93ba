"""Plan search on one chip group: enumerate the pruned space, price it, keep the best.

`search_group` is pure: it takes a model, a resolved node group and a batch, prices every
candidate with the vectorised cost model (plus, where recomputing every layer fits and
none does not, the plans recomputing only as many layers as fit: `partial.py`), drops
what does not fit in memory or what the
framework cannot run (`argosy.planner.support`) and returns
the candidates sorted by step time (ties broken by less memory). `estimate_one` prices a
single configuration; `smallest_fix` says what change makes an infeasible job fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argosy.hardware.cluster import NodeGroup
from argosy.planner.costmodel import Costs, Hardware, evaluate
from argosy.planner.efficiency import Constants
from argosy.planner.frameworks import Profile, Scales, load_framework
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Candidates, Parallel
from argosy.planner.partial import partial_candidates
from argosy.planner.space import enumerate_space
from argosy.planner.support import fixed_fields, supported


@dataclass
class Ranked:
    """Candidates and their costs, best first; `fits` marks memory-feasible ones."""

    cands: Candidates
    costs: Costs
    order: np.ndarray
    hw: Hardware
    devices: int
    samples: int

    def __len__(self) -> int:
        return len(self.order)

    def plan(self, rank: int) -> Parallel:
        return self.cands.plan(int(self.order[rank]))

    def index(self, rank: int) -> int:
        return int(self.order[rank])

    def step_s(self, rank: int) -> float:
        return float(self.costs.step_s[self.order[rank]])


def search_group(
    model: ModelSpec,
    group: NodeGroup,
    seq_len: int,
    samples: int,
    *,
    fixed: dict[str, object] | None = None,
    exact_batch: bool = True,
    devices: int | None = None,
    constants: Constants | None = None,
    include_infeasible: bool = False,
    framework: Profile | str | None = None,
    scales: Scales | None = None,
) -> Ranked:
    """Every candidate for `group` (or `devices` of its chip), best first."""
    devices = devices or group.num_devices
    fw = load_framework(framework)
    hw = Hardware.of(group, constants)
    if not fw.context_parallel:
        fixed = {**(fixed or {}), "cp": 1}
    fixed = {**fixed_fields(fw.name, model), **(fixed or {})}
    cands = enumerate_space(
        model, devices, hw.domain_size, seq_len, samples, fixed, exact_batch,
        flash_default=fw.flash_attention, interleaved=fw.interleaved_pipeline,
        zero_stages=fw.distinct_zero_stages(),
    )  # fmt: skip
    cands = cands.take(np.flatnonzero(supported(fw.name, cands, model, samples)))
    if len(cands) == 0:
        costs = evaluate(model, hw, seq_len, cands, 0.0, constants, fw, scales)
        return Ranked(cands, costs, np.zeros(0, dtype=np.int64), hw, devices, samples)
    costs = evaluate(model, hw, seq_len, cands, samples / cands.dp, constants, fw, scales)
    if "recompute" not in fixed and "recompute_layers" not in fixed:
        more = partial_candidates(model, hw, seq_len, cands, costs, samples, fw, constants, scales)
        if len(more):
            more_costs = evaluate(
                model, hw, seq_len, more, samples / more.dp, constants, fw, scales
            )
            cands, costs = cands.concat(more), costs.concat(more_costs)
    keep = np.arange(len(cands)) if include_infeasible else np.flatnonzero(costs.fits)
    order = keep[np.lexsort((costs.memory_gib[keep], costs.step_s[keep]))]
    return Ranked(cands, costs, order, hw, devices, samples)


def estimate_one(
    model: ModelSpec,
    group: NodeGroup,
    seq_len: int,
    global_batch: int,
    plan: Parallel,
    constants: Constants | None = None,
    framework: Profile | str | None = None,
) -> tuple[Costs, Hardware]:
    """Costs of one configuration on one homogeneous group (arrays of length 1)."""
    hw = Hardware.of(group, constants)
    cands = Candidates.of([plan])
    costs = evaluate(model, hw, seq_len, cands, global_batch / plan.dp, constants, framework)
    return costs, hw


def overflow_reasons(costs: Costs, i: int = 0) -> list[str]:
    """Why candidate `i` does not fit, naming the largest memory terms."""
    total = float(costs.memory_gib[i])
    if total <= costs.capacity_gib:
        return []
    terms = sorted(costs.memory.terms(i).items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{name} {gib:.1f}" for name, gib in terms[:3])
    return [
        f"memory {total:.1f} GiB exceeds the device's {costs.capacity_gib:g} GiB by "
        f"{total - costs.capacity_gib:.1f} GiB (largest terms, GiB: {parts})"
    ]


def factoring_alternatives(
    model: ModelSpec,
    group: NodeGroup,
    seq_len: int,
    samples: int,
    constants: Constants | None = None,
    framework: Profile | str | None = None,
) -> tuple[Ranked | None, list[int]]:
    """When no layout divides `group` for `samples` sequences: the fastest plans on fewer
    devices (whole nodes, down to half the group), and the global batches nearest
    `samples` that do factor on all the devices."""
    n = group.num_devices
    per_node = group.devices_per_node
    counts = [c for c in range(n - 1, max(0, n // 2) - 1, -1) if c % per_node == 0][:64]
    counts = counts or list(range(n - 1, max(0, n // 2) - 1, -1))[:64]
    fewer = None
    for count in counts:
        ranked = search_group(
            model, group, seq_len, samples, devices=count, constants=constants,
            framework=framework,
        )  # fmt: skip
        if len(ranked) and (fewer is None or ranked.step_s(0) < fewer.step_s(0)):
            fewer = ranked
    fw = load_framework(framework)
    batches: list[int] = []
    for delta in range(1, samples):
        for b in (samples - delta, samples + delta):
            if b < 1 or len(batches) >= 2:
                continue
            cands = enumerate_space(
                model, n, group.domain_size, seq_len, b,
                flash_default=fw.flash_attention, interleaved=fw.interleaved_pipeline,
            )  # fmt: skip
            if len(cands):
                batches.append(b)
        if len(batches) >= 2:
            break
    return fewer, sorted(batches)


def smallest_fix(
    model: ModelSpec,
    group: NodeGroup,
    seq_len: int,
    samples: int,
    constants: Constants | None = None,
    framework: Profile | str | None = None,
) -> str:
    """The smallest change that lets the job fit: full recompute + ZeRO-3, else more devices."""
    ranked = search_group(
        model, group, seq_len, samples, constants=constants, include_infeasible=True,
        framework=framework,
    )  # fmt: skip
    if len(ranked):
        best = int(np.argmin(ranked.costs.memory_gib))
        plan = ranked.cands.plan(best)
        need = float(ranked.costs.memory_gib[best])
        hint = f"even {plan.text()} needs {need:.1f} GiB per device"
    else:
        fewer, batches = factoring_alternatives(
            model, group, seq_len, samples, constants, framework
        )
        parts = [
            f"{group.num_devices} devices do not factor into tp x pp x cp x dp with dp x mbs "
            f"dividing the batch of {samples}"
        ]
        if fewer is not None:
            parts.append(f"{fewer.devices} devices do ({fewer.plan(0).text()})")
        if batches:
            options = " or ".join(map(str, batches))
            parts.append(f"or a global batch of {options} on all {group.num_devices}")
        return "; ".join(parts)
    for factor in (2, 4, 8, 16, 32, 64):
        more = group.num_devices * factor
        ranked = search_group(
            model, group, seq_len, samples, devices=more, constants=constants, framework=framework
        )
        if len(ranked):
            return f"{hint}; it fits on {more} x {group.chip.id} ({ranked.plan(0).text()})"
    return f"{hint}; it does not fit on up to 64x more devices: reduce seq-len or batch"
