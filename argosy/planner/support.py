"""Which layouts each training framework can actually run, as data the search applies.

Contract: `refusal(framework, plan, model, samples)` returns why `framework` cannot run
`plan` for `samples` sequences per step (None when it can); `supported(framework, cands,
model, samples)` is the same rule as a boolean mask over many candidates, so the search
ranks unsupported plans out under that framework's profile; `fixed_fields(framework,
model)` are plan fields the framework fixes for a model (torchtitan's registry config
trains Llama 3 405B in Float8), which the search pins. Every rule names the code
that enforces it in the framework (read in the releases benchmarks/emit_check.py runs):

- Megatron-Core (0.16-0.19) interleaved schedule (`schedules.py`,
  `forward_backward_pipelining_with_interleaving`): with vpp > 1 the micro-batch count
  must be a multiple of pp (micro-batch groups of pp per virtual stage);
- DeepSpeed's PipelineEngine runs ZeRO stage 0 or 1 only, and Megatron-DeepSpeed's
  pipeline grid (pp x tp x dp) has no axis for the Ulysses degree that carries CP, so
  with pp > 1 neither ZeRO-2/3 nor cp > 1 runs; it has no interleaved schedule;
- torchtitan builds ceil((layers + first + last) / layers_per_stage) stages, which must
  come out pp x vpp (`stage_cut` finds the knobs or says there are none);
- torchtitan's pipeline schedules (torch.distributed.pipelining): 1F1B needs at least
  pp micro-batches, Interleaved1F1B a micro-batch count that is a multiple of its rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from argosy.planner.frameworks import load_framework
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Candidates, Parallel

MEGATRON = ("megatron-core", "megatron-lm")


@dataclass(frozen=True)
class Entry:
    """A torchtitan config-registry function and what it fixes."""

    module: str
    config: str
    layers: int
    fp8: bool = False
    moe: bool = False


# torchtitan 0.3.0 torchtitan/models/*/config_registry.py
TORCHTITAN_REGISTRY = {
    "llama3-8b": Entry("llama3", "llama3_8b", 32),
    "llama3-70b": Entry("llama3", "llama3_70b", 80),
    "llama3-405b": Entry("llama3", "llama3_405b", 126, fp8=True),
    "deepseek-v3-like": Entry("deepseek_v3", "deepseek_v3_671b", 61, moe=True),
}


def fixed_fields(framework: str, model: ModelSpec) -> dict[str, object]:
    """Plan fields a framework fixes for a model: torchtitan's registry config for Llama 3
    405B trains in Float8, so its plans are priced (and emitted) with fp8."""
    entry = TORCHTITAN_REGISTRY.get(model.name) if framework == "torchtitan" else None
    if entry is not None and entry.layers == model.layers and entry.fp8:
        return {"fp8": True}
    return {}


def stage_cut(layers: int, stages: int) -> tuple[int, int, int] | None:
    """(layers per stage, first-stage and last-stage "less layers") that make torchtitan
    build exactly `stages` stages: it counts the embedding and the output as that many
    layers, makes ceil((layers + first + last) / per) stages and needs each weight at most
    the floor share. The weights nearest its default (1, 1) win."""
    for extra in sorted(range(0, 2 * layers + 1), key=lambda e: (abs(e - 2), e)):
        first, last = extra // 2, extra - extra // 2
        effective = layers + extra
        if last > effective // stages:
            continue
        for per in range(max(1, effective // stages), effective + 1):
            if math.ceil(effective / per) == stages:
                return per, first, last
    return None


def refusal(framework: str, plan: Parallel, model: ModelSpec, samples: int) -> str | None:
    """Why `framework` cannot run `plan` (None: it can)."""
    cands = Candidates.of([plan])
    reasons = _rules(framework, cands, model, samples)
    for text, bad in reasons:
        if bool(bad[0]):
            return text.format(**plan.as_dict(), m=_microbatches(cands, samples)[0])
    return None


def supported(framework: str, cands: Candidates, model: ModelSpec, samples: int) -> np.ndarray:
    """True for each candidate `framework` can run."""
    ok = np.ones(len(cands), dtype=bool)
    for _, bad in _rules(framework, cands, model, samples):
        ok &= ~bad
    return ok


def _microbatches(cands: Candidates, samples: int) -> np.ndarray:
    per_replica = -(-samples // cands.dp)
    return -(-per_replica // cands.mbs)


def _rules(
    framework: str, c: Candidates, model: ModelSpec, samples: int
) -> list[tuple[str, np.ndarray]]:
    rules = _own_rules(framework, c, model, samples)
    if not load_framework(framework).partial_recompute:
        partial = (c.recompute == 2) & (c.recompute_layers > 0)
        why = (
            f"{framework} recomputes every layer or none (no block method); this plan "
            "recomputes {recompute_layers} layers of each model chunk"
        )
        rules.insert(0, (why, partial))
    return rules


def _own_rules(
    framework: str, c: Candidates, model: ModelSpec, samples: int
) -> list[tuple[str, np.ndarray]]:
    if framework in MEGATRON:
        m = _microbatches(c, samples)
        return [
            (
                "Megatron-Core's interleaved schedule (vpp={vpp}) needs the micro-batch count "
                "to be a multiple of pp={pp}; this plan has {m} micro-batches per replica",
                (c.vpp > 1) & (m % c.pp != 0),
            )
        ]
    if framework == "deepspeed":
        pipe = c.pp > 1
        return [
            (
                "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only (zero={zero}, pp={pp})",
                pipe & (c.zero >= 2),
            ),
            (
                "Megatron-DeepSpeed's pipeline grid (pp x tp x dp) has no axis for the Ulysses "
                "degree that carries context parallelism (cp={cp}, pp={pp})",
                pipe & (c.cp > 1),
            ),
            ("DeepSpeed has no interleaved pipeline schedule (vpp={vpp})", c.vpp > 1),
            ("Megatron-DeepSpeed has no fp8 training (fp8={fp8})", c.fp8.astype(bool)),
            (
                "DeepSpeed draws expert-parallel groups from the data-parallel ranks only: "
                "ep={ep} must divide dp x cp (dp={dp}, cp={cp})",
                (c.ep > 1) & ((c.dp * c.cp) % c.ep != 0),
            ),
        ]
    if framework == "torchtitan":
        return _torchtitan_rules(c, model, samples)
    return []


def _torchtitan_expert_rules(c: Candidates, model: ModelSpec) -> list:
    """torchtitan 0.3's sparse mesh (pp x dp_replicate x efsdp x ep, parallel_dims.py):
    with EP on, experts are never split over TP and efsdp = dp_shard*cp*tp/ep must be
    whole (dp_shard is dp under FSDP, zero >= 2, else 1); with EP off, TP splits them."""
    if not model.is_moe:
        return []
    shard = np.where(c.zero >= 2, c.dp, 1)
    return [
        (
            "torchtitan runs routed experts whole when ep > 1 (its sparse mesh has no TP "
            "axis); this plan splits them over etp={etp}, tp={tp}",
            (c.ep > 1) & (c.expert_tp != 1),
        ),
        (
            "torchtitan splits routed experts over TP when ep = 1; this plan keeps them "
            "whole (etp={etp}, tp={tp})",
            (c.ep == 1) & (c.expert_tp != c.tp),
        ),
        (
            "torchtitan's expert region is dp_shard x cp x tp ranks (dp_shard = dp under "
            "FSDP, zero >= 2, else 1): ep={ep} does not divide it (dp={dp}, cp={cp}, "
            "tp={tp}, zero={zero})",
            (c.ep > 1) & ((shard * c.cp * c.tp) % c.ep != 0),
        ),
    ]


def _torchtitan_rules(c: Candidates, model: ModelSpec, samples: int) -> list:
    m = _microbatches(c, samples)
    rounds = np.maximum(1, m // c.pp)
    stages = c.pp * c.vpp
    cuts = {int(s): stage_cut(model.layers, int(s)) is not None for s in np.unique(stages)}
    uncut = np.array([not cuts[int(s)] for s in stages], dtype=bool)
    return _torchtitan_expert_rules(c, model) + [
        (
            "torchtitan cannot cut the model's layers into pp*vpp stages (pp={pp}, "
            "vpp={vpp}) with any pipeline_parallel_layers_per_stage",
            (c.vpp > 1) & uncut,
        ),
        (
            "torch.distributed.pipelining's 1F1B needs at least pp={pp} micro-batches; "
            "this plan has {m} per replica",
            (c.pp > 1) & (c.vpp == 1) & (m < c.pp),
        ),
        (
            "torch.distributed.pipelining's Interleaved1F1B needs the micro-batch count to be "
            "a multiple of its rounds (count // pp={pp}); this plan has {m}",
            (c.pp > 1) & (c.vpp > 1) & (m % rounds != 0),
        ),
    ]
