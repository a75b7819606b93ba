"""The planner's two entry points, returning plain dicts (the CLI's JSON contract).

    estimate(model, cluster, plan, seq_len, global_batch) -> {feasible, reasons, predicted, ...}
    plan(model, cluster, seq_len, global_batch, top=5)   -> {plans, search, feasible, ...}

Mixed clusters get plans of two families, ranked together: `split: "batch"` (each chip
group runs its own replicas on a share of the batch) and `split: "layers"` (pipelines
spanning chip types with non-uniform layers per stage); `groups` says, per chip type,
its devices, degrees, layers and batch share.

`predicted` holds step_time_s, tokens_per_s, tflops_per_gpu (model FLOPs),
hardware_tflops_per_gpu, mfu (model FLOPs over aggregate dense peak) and
memory_gib_per_device (the largest over devices), plus the step-time breakdown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from argosy.core.errors import ArgosyError
from argosy.hardware.cluster import Cluster, NodeGroup
from argosy.planner.costmodel import Costs
from argosy.planner.efficiency import Constants
from argosy.planner.frameworks import Profile, load_framework
from argosy.planner.hetero import MixedPlan, plan_mixed
from argosy.planner.layersplit import LayerSplit, plan_layer_split
from argosy.planner.memory import GIB
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Parallel, check_parallel
from argosy.planner.search import (
    Ranked,
    estimate_one,
    factoring_alternatives,
    overflow_reasons,
    search_group,
    smallest_fix,
)
from argosy.planner.support import refusal


def predicted(
    costs: Costs, i: int, devices: int, peak_flops_total: float, seq_len: int, samples: float
) -> dict:
    """The `predicted` object for candidate `i`."""
    step = float(costs.step_s[i])
    model_flops, hw_flops = float(costs.model_flops[i]), float(costs.hardware_flops[i])
    out = {
        "step_time_s": step,
        "tokens_per_s": samples * seq_len / step,
        "tflops_per_gpu": model_flops / step / devices / 1e12,
        "hardware_tflops_per_gpu": hw_flops / step / devices / 1e12,
        "mfu": model_flops / step / peak_flops_total,
        "memory_gib_per_device": float(costs.memory_gib[i]),
        "memory_allocated_gib": float(costs.memory.allocated[i]) / GIB,
        "memory_gib": {k: round(v, 3) for k, v in costs.memory.terms(i).items()},
    }
    out["breakdown_s"] = costs.breakdown(i)
    return out


def merge_same_chip(cluster: Cluster) -> Cluster:
    """One group per chip type: groups of one chip are planned as a single group (the
    slower NIC and the smaller scale-up domain of the two govern). Groups of one chip
    with different devices per node cannot be one layout and are rejected."""
    by_chip: dict[str, list[NodeGroup]] = {}
    for group in cluster.groups:
        by_chip.setdefault(group.chip.id, []).append(group)
    if all(len(gs) == 1 for gs in by_chip.values()):
        return cluster
    merged = []
    for chip, gs in by_chip.items():
        per_node = {g.devices_per_node for g in gs}
        if len(per_node) > 1:
            raise ArgosyError(
                f"the {chip} groups have {sorted(per_node)} devices per node: one layout cannot "
                "span them; give them one node size or plan them as separate clusters"
            )
        merged.append(
            replace(
                gs[0],
                index=len(merged),
                num_devices=sum(g.num_devices for g in gs),
                domain_size=min(g.domain_size for g in gs),
                nic_gbps=min(g.nic_gbps for g in gs),
            )
        )
    return replace(cluster, groups=tuple(merged))


def estimate(
    model: ModelSpec,
    cluster: Cluster,
    plan: Parallel,
    seq_len: int,
    global_batch: int,
    constants: Constants | None = None,
    framework: Profile | str | None = None,
) -> dict:
    """Price one configuration on a homogeneous cluster under `framework`."""
    fw = load_framework(framework)
    cluster = merge_same_chip(cluster)
    if cluster.is_mixed:
        raise ArgosyError("estimate prices one chip type; for a mixed cluster use `argosy plan`")
    check_parallel(plan, model, cluster.num_devices, seq_len, global_batch)
    if plan.vpp > 1 and not fw.interleaved_pipeline:
        raise ArgosyError(f"{fw.name} has no interleaved pipeline schedule: vpp must be 1")
    if plan.cp > 1 and not fw.context_parallel:
        raise ArgosyError(f"{fw.name} has no context parallelism: cp must be 1")
    group = cluster.groups[0]
    costs, hw = estimate_one(model, group, seq_len, global_batch, plan, constants, fw)
    reasons = overflow_reasons(costs, 0)
    if plan.tp > hw.domain_size:
        reasons.append(f"tp={plan.tp} spans beyond the {hw.domain_size}-device scale-up domain")
    unsupported = refusal(fw.name, plan, model, global_batch)
    if unsupported:
        reasons.append(unsupported)
    out = {
        "model": model.name,
        "cluster": cluster.describe(),
        "framework": fw.name,
        "parallel": plan.as_dict(),
        "feasible": not reasons,
        "reasons": reasons,
        "predicted": predicted(
            costs,
            0,
            cluster.num_devices,
            hw.peak_flops * cluster.num_devices,
            seq_len,
            global_batch,
        ),
    }
    if costs.fits[0]:
        return out
    fix = _estimate_fix(model, group, plan, seq_len, global_batch, constants, fw)
    out["fix"] = fix or smallest_fix(model, group, seq_len, global_batch, constants, fw)
    return out


def _estimate_fix(
    model, group, plan: Parallel, seq_len, global_batch, constants, fw: Profile
) -> str | None:
    """The least invasive change to `plan` that fits: more ZeRO, then more recompute (under
    a profile with the block method, full recompute of as few layers as fit first)."""
    options: list[dict] = [{"zero": z} for z in range(plan.zero + 1, 4)]
    order = ("none", "selective", "full")
    chunk = -(-model.layers // (plan.pp * plan.vpp))
    for rec in order[order.index(plan.recompute) + 1 :]:
        if rec == "full" and fw.partial_recompute:
            options += [{"recompute": rec, "recompute_layers": k} for k in range(1, chunk)]
        options += [{"recompute": rec, "recompute_layers": 0}]
        options += [
            {"recompute": rec, "recompute_layers": 0, "zero": z} for z in range(plan.zero + 1, 4)
        ]
    for change in options:
        costs, _ = estimate_one(
            model, group, seq_len, global_batch, replace(plan, **change), constants, fw
        )
        if costs.fits[0]:
            what = ", ".join(f"{k}={v}" for k, v in change.items() if k != "recompute_layers" or v)
            gib, step = float(costs.memory_gib[0]), float(costs.step_s[0])
            return f"{what} fits ({gib:.1f} GiB per device, step {step:.2f} s)"
    return None


def plan(
    model: ModelSpec,
    cluster: Cluster,
    seq_len: int,
    global_batch: int,
    top: int = 5,
    constants: Constants | None = None,
    progress: Callable[[int], None] | None = None,
    framework: Profile | str | None = None,
) -> dict:
    """The best `top` plans for `model` on `cluster` under `framework`, best first."""
    started = time.perf_counter()
    fw = load_framework(framework)
    cluster = merge_same_chip(cluster)
    if cluster.is_mixed:
        result = _plan_mixed(model, cluster, seq_len, global_batch, top, constants, progress, fw)
    else:
        result = _plan_homogeneous(model, cluster, seq_len, global_batch, top, constants, fw)
        if progress:
            progress(1)
    result["search"]["seconds"] = time.perf_counter() - started
    return {
        "model": model.name,
        "cluster": cluster.describe(),
        "framework": fw.name,
        "seq_len": seq_len,
        "global_batch": global_batch,
        **result,
    }


def _plan_homogeneous(model, cluster, seq_len, global_batch, top, constants, fw) -> dict:
    group = cluster.groups[0]
    ranked = search_group(model, group, seq_len, global_batch, constants=constants, framework=fw)
    plans = [
        _entry(ranked, r, cluster, seq_len, global_batch) for r in range(min(top, len(ranked)))
    ]
    out: dict = {
        "plans": plans,
        "search": {"candidates": len(ranked.cands), "feasible": len(ranked)},
    }
    out["feasible"] = bool(plans)
    if not plans:
        out["fix"] = smallest_fix(model, group, seq_len, global_batch, constants, fw)
    if not len(ranked.cands):
        fewer, batches = factoring_alternatives(model, group, seq_len, global_batch, constants, fw)
        out["alternatives"] = {"global_batches": batches}
        if fewer is not None:
            sub = replace(cluster, groups=(replace(group, num_devices=fewer.devices),))
            out["alternatives"]["devices"] = fewer.devices
            out["alternatives"]["plans"] = [
                _entry(fewer, r, sub, seq_len, global_batch) for r in range(min(top, len(fewer)))
            ]
    return out


def _entry(ranked: Ranked, rank: int, cluster: Cluster, seq_len: int, samples: int) -> dict:
    i = ranked.index(rank)
    peak = ranked.hw.peak_flops * cluster.num_devices
    return {
        "parallel": ranked.plan(rank).as_dict(),
        "predicted": predicted(ranked.costs, i, cluster.num_devices, peak, seq_len, samples),
    }


def _plan_mixed(model, cluster, seq_len, global_batch, top, constants, progress, fw) -> dict:
    mixed = plan_mixed(model, cluster, seq_len, global_batch, constants, progress, fw)
    split = plan_layer_split(model, cluster, seq_len, global_batch, constants)
    out: dict = {"search": {"candidates": mixed.candidates + (split.candidates if split else 0)}}
    plans = []
    # `argosy launch --plan` runs every rank of a batch split as a data-parallel replica:
    # each needs a sequence, so a smaller batch gets layer splits only
    too_small = global_batch < cluster.num_devices
    if mixed.feasible and not too_small:
        depth = min(top, *(len(p.ranked) for p in mixed.parts if p.samples))
        plans = [_mixed_entry(mixed, r, cluster, seq_len, global_batch) for r in range(depth)]
    if too_small:
        out["batch_split"] = (
            f"global batch {global_batch} cannot give each of the {cluster.num_devices} "
            f"devices a sequence: a batch split needs --global-batch {cluster.num_devices} or more"
        )
    if split is not None:
        plans.append(_layer_split_entry(split, model, cluster, seq_len, global_batch))
    plans.sort(key=lambda e: e["predicted"]["step_time_s"])
    out["plans"] = plans[:top]
    out["feasible"] = bool(plans)
    if not plans and too_small:
        out["fix"] = out["batch_split"]
    elif not plans:
        short = [p.group for p in mixed.parts if p.samples and not len(p.ranked)]
        out["fix"] = "; ".join(
            f"{g.chip.id}: "
            + smallest_fix(model, g, seq_len, max(1, global_batch // 2), constants, fw)
            for g in short
        )
    elif mixed.feasible and not too_small:
        best = out["plans"][0]["predicted"]["step_time_s"]
        out["mixed_efficiency"] = mixed.efficiency() * mixed.step_s / best
    return out


def _layer_split_entry(split: LayerSplit, model, cluster: Cluster, seq_len: int, gbs: int) -> dict:
    model_flops = 3.0 * model.forward_flops_per_token(seq_len) * seq_len * gbs
    extra = {"none": 0.0, "selective": 4.0 * seq_len * model.hidden * model.layers}
    rec = extra.get(split.parallel.recompute)
    if rec is None:
        rec = model.forward_flops_per_token(seq_len) - 2.0 * model.vocab * model.hidden
    hw_flops = model_flops + rec * seq_len * gbs
    peak = sum(g.chip.peak_tflops("bf16") * 1e12 * g.num_devices for g in cluster.groups)
    step, devices = split.step_s, cluster.num_devices
    groups = [
        {
            "chip": g.chip,
            "devices": g.devices,
            "parallel": {**split.parallel.as_dict(), "pp": g.stages},
            "layers": g.layers,
            "stages": g.stages,
            "batch_share": gbs,
            "batch_fraction": 1.0,
            "stage_time_s": g.stage_s,
            "memory_gib_per_device": g.memory_gib,
        }
        for g in split.groups
    ]
    return {
        "parallel": split.parallel.as_dict(),
        "split": "layers",
        "predicted": _predicted(
            step,
            gbs * seq_len,
            model_flops,
            hw_flops,
            devices,
            peak,
            max(g.memory_gib for g in split.groups),
        ),
        "groups": groups,
    }


def _predicted(
    step: float,
    tokens: float,
    model_flops: float,
    hw_flops: float,
    devices: int,
    peak: float,
    memory_gib: float,
) -> dict:
    """The `predicted` block of a plan whose totals are summed over chip groups."""
    return {
        "step_time_s": step,
        "tokens_per_s": tokens / step,
        "tflops_per_gpu": model_flops / step / devices / 1e12,
        "hardware_tflops_per_gpu": hw_flops / step / devices / 1e12,
        "mfu": model_flops / step / peak,
        "memory_gib_per_device": memory_gib,
    }


def _mixed_entry(
    mixed: MixedPlan, rank: int, cluster: Cluster, seq_len: int, global_batch: int
) -> dict:
    groups, step, model_flops, hw_flops, memory = [], 0.0, 0.0, 0.0, 0.0
    for part in mixed.parts:
        if not part.samples:
            groups.append(
                {"chip": part.group.chip.id, "devices": part.group.num_devices, "batch_share": 0}
            )
            continue
        r = min(rank, len(part.ranked) - 1)
        i = part.ranked.index(r)
        costs = part.ranked.costs
        step = max(step, float(costs.step_s[i]))
        model_flops += float(costs.model_flops[i])
        hw_flops += float(costs.hardware_flops[i])
        memory = max(memory, float(costs.memory_gib[i]))
        groups.append(_group_entry(part, r, i, global_batch))
    step = max(step, mixed.step_s) if rank == 0 else step + mixed.sync_s
    devices = cluster.num_devices
    peak = sum(g.chip.peak_tflops("bf16") * 1e12 * g.num_devices for g in cluster.groups)
    largest = max((g for g in groups if g.get("parallel")), key=lambda g: g["devices"])
    return {
        "parallel": largest["parallel"],
        "split": "batch",
        "predicted": {
            **_predicted(
                step, global_batch * seq_len, model_flops, hw_flops, devices, peak, memory
            ),
            "cross_group_sync_s": mixed.sync_s,
            "cross_group_traffic_s": mixed.sync_traffic_s,
        },
        "groups": groups,
    }


def _group_entry(part, rank: int, i: int, global_batch: int) -> dict:
    plan_ = part.ranked.plan(rank)
    return {
        "chip": part.group.chip.id,
        "devices": part.group.num_devices,
        "parallel": plan_.as_dict(),
        "layers": "all",
        "batch_share": part.samples,
        "batch_fraction": part.samples / global_batch,
        "step_time_s": float(part.ranked.costs.step_s[i]),
        "memory_gib_per_device": float(part.ranked.costs.memory_gib[i]),
        "micro_batches_per_replica": int(np.ceil(part.samples / plan_.dp / plan_.mbs)),
    }
