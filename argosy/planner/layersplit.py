"""Mixed-chip pipelines: each replica's pipeline spans every chip type, with a
non-uniform number of layers per stage so that stages finish together.

For a common TP degree and data-parallel degree d, group g holds pp_g = N_g/(tp*d)
stages of l_g layers each (sum pp_g * l_g = layers). Layers go to each chip in
proportion to its per-layer speed, then one at a time to whichever stage stays fastest,
within each chip's memory (the group's first stage holds the most micro-batches in
flight; the first group also holds the embedding, the last the LM head and logits).
Step = (micro-batches + stages - 1) x (slowest stage + send/recv on the slowest link the
boundary crosses) + exposed data-parallel traffic + optimizer.

    best = plan_layer_split(model, cluster, seq_len=4096, global_batch=1024)
    best.step_s, [(p.chip, p.stages, p.layers) for p in best.groups]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce

import numpy as np

from argosy.hardware.cluster import Cluster
from argosy.planner.costmodel import Hardware, microbatch_times
from argosy.planner.efficiency import Constants, default_constants
from argosy.planner.memory import GIB, activation_bytes_per_layer, layer_params_per_device
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import RECOMPUTE, Candidates, Parallel
from argosy.planner.space import MBS

ZEROS = (0, 1, 2)


@dataclass(frozen=True)
class StageGroup:
    """One chip type's part of a layer-split pipeline (`layers` over all its stages)."""

    chip: str
    devices: int
    stages: int
    layers: int
    stage_s: float
    memory_gib: float


@dataclass(frozen=True)
class LayerSplit:
    """A pipeline spanning chip types, replicated `parallel.dp` times."""

    parallel: Parallel
    groups: tuple[StageGroup, ...]
    step_s: float
    candidates: int


def plan_layer_split(
    model: ModelSpec,
    cluster: Cluster,
    seq_len: int,
    global_batch: int,
    constants: Constants | None = None,
) -> LayerSplit | None:
    """The fastest layer-split pipeline that fits, or None when no layout divides the cluster."""
    hws = [Hardware.of(g, constants) for g in cluster.groups]
    order = sorted(
        range(len(hws)), key=lambda i: -hws[i].memory_gib
    )  # roomiest first: most in flight
    best: LayerSplit | None = None
    count = 0
    for tp in _tps(model, hws):
        per = [cluster.groups[i].num_devices // tp for i in order]
        if any(cluster.groups[i].num_devices % tp for i in order):
            continue
        for d in _divisors(reduce(math.gcd, per)):
            stages = [n // d for n in per]
            if sum(stages) > model.layers or global_batch % d:
                continue
            for mbs in (m for m in MBS if (global_batch // d) % m == 0):
                for rec in range(3):
                    for zero in ZEROS:
                        count += 1
                        plan = Parallel(
                            tp=tp,
                            pp=sum(stages),
                            dp=d,
                            mbs=mbs,
                            recompute=RECOMPUTE[rec],
                            zero=zero,
                        )
                        found = _price(
                            model,
                            [hws[i] for i in order],
                            stages,
                            plan,
                            seq_len,
                            global_batch,
                            constants,
                        )
                        if found and (best is None or found.step_s < best.step_s):
                            best = found
    if best is None:
        return None
    return LayerSplit(best.parallel, best.groups, best.step_s, count)


def _tps(model: ModelSpec, hws: list[Hardware]) -> list[int]:
    limit = min(h.domain_size for h in hws)
    return [
        t for t in (1, 2, 4, 8, 16) if t <= limit and model.heads % t == 0 and model.kv % t == 0
    ]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _price(model, hws, stages, plan: Parallel, seq_len, gbs, constants) -> LayerSplit | None:
    consts = constants or default_constants()
    fw = consts.framework
    cand = Candidates.of([plan])
    nmb = gbs // (plan.dp * plan.mbs)
    per_layer = np.array(
        [float(microbatch_times(model, hw, seq_len, cand, consts)[0][0]) for hw in hws]
    )
    head = float(microbatch_times(model, hws[-1], seq_len, cand, consts)[1][0])
    held = _split_layers(model.layers, stages, per_layer, head)
    layers = [math.ceil(h / n) for h, n in zip(held, stages, strict=True)]  # slowest stage
    mems = _memory_gib(model, hws, stages, layers, plan, seq_len, nmb, fw.reserved_gib)
    if any(m > hw.memory_gib for m, hw in zip(mems, hws, strict=True)):
        return None
    stage_s = [lay * t for lay, t in zip(layers, per_layer, strict=True)]
    stage_s[-1] += head
    total_stages = sum(stages)
    nic = min(hw.nic_bps * hw.eff.nic_eff for hw in hws)
    p2p = 2.0 * plan.mbs * seq_len * model.hidden * 2.0 / plan.tp / nic if total_stages > 1 else 0.0
    per_mb = max(stage_s) + p2p
    pipe = (nmb + total_stages - 1) * per_mb
    dp = max(
        _dp_exposed(model, hw, lay, plan, per_mb, fw) for hw, lay in zip(hws, layers, strict=True)
    )
    step = (pipe + dp + fw.step_overhead_s) * (1.0 + fw.straggler_per_doubling * math.log2(plan.dp))
    groups = tuple(
        StageGroup(hw.chip_id, n * plan.tp * plan.dp, n, h, s, m)
        for hw, n, h, s, m in zip(hws, stages, held, stage_s, mems, strict=True)
    )
    return LayerSplit(plan, groups, step, 1)


def _split_layers(total: int, stages: list[int], per_layer: np.ndarray, head: float) -> list[int]:
    """Layers held by each group (spread over its stages, at least one per stage): each
    next layer goes to the group whose slowest stage stays fastest with it."""
    held = list(stages)
    last = len(stages) - 1
    for _ in range(total - sum(stages)):
        times = [
            math.ceil((h + 1) / n) * t + (head if i == last else 0.0)
            for i, (h, n, t) in enumerate(zip(held, stages, per_layer, strict=True))
        ]
        held[int(np.argmin(times))] += 1
    return held


def _memory_gib(
    model, hws, stages, layers, plan: Parallel, seq_len, nmb, reserved_gib
) -> list[float]:
    cand = Candidates.of([plan])
    per_layer_params = float(layer_params_per_device(model, cand)[0])
    act_layer = float(activation_bytes_per_layer(model, cand, seq_len)[0])
    tokens = plan.mbs * seq_len
    total, position, out = sum(stages), 0, []
    for i, (lay, n) in enumerate(zip(layers, stages, strict=True)):
        params = lay * per_layer_params
        params += model.vocab * model.hidden / plan.tp if i in (0, len(stages) - 1) else 0.0
        shard = plan.dp if plan.zero >= 1 else 1
        state = (
            2.0 * params + 4.0 * params / (plan.dp if plan.zero >= 2 else 1) + 12.0 * params / shard
        )
        inflight = min(total - position, nmb)
        acts = lay * act_layer * inflight + 2.0 * tokens * model.hidden * inflight
        logits = 8.0 * tokens * model.vocab / plan.tp if i == len(stages) - 1 else 0.0
        out.append((state + acts + logits) / GIB + reserved_gib)
        position += n
    return out


def _dp_exposed(model, hw: Hardware, layers: int, plan: Parallel, per_mb: float, fw) -> float:
    if plan.dp == 1:
        return 0.0
    params = layers * float(layer_params_per_device(model, Candidates.of([plan]))[0])
    grad = params * fw.grad_bytes
    comm = 2.0 * (plan.dp - 1) / plan.dp * grad / (hw.nic_bps * hw.eff.nic_eff)
    return max(0.0, comm - fw.dp_overlap * per_mb * 2.0 / 3.0)
