"""Which layouts each training framework can actually run, as data the search applies.

Contract: `refusal(framework, plan, model, samples)` returns why `framework` cannot run
`plan` for `samples` sequences per step (None when it can); `supported(framework, cands,
model, samples)` is the same rule as a boolean mask over many candidates, so the search
ranks unsupported plans out under that framework's profile. Every rule names the code
that enforces it in the framework (read in the releases benchmarks/emit_check.py runs):

- Megatron-Core (0.16-0.19) interleaved schedule (`schedules.py`,
  `forward_backward_pipelining_with_interleaving`): with vpp > 1 the micro-batch count
  must be a multiple of pp (micro-batch groups of pp per virtual stage);
- DeepSpeed's PipelineEngine runs ZeRO stage 0 or 1 only, and Megatron-DeepSpeed's
  pipeline grid (pp x tp x dp) has no axis for the Ulysses degree that carries CP, so
  with pp > 1 neither ZeRO-2/3 nor cp > 1 runs; it has no interleaved schedule;
- torchtitan's pipeline schedules (torch.distributed.pipelining): 1F1B needs at least
  pp micro-batches, Interleaved1F1B a micro-batch count that is a multiple of its rounds.
"""

from __future__ import annotations

import numpy as np

from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Candidates, Parallel

MEGATRON = ("megatron-core", "megatron-lm")


def refusal(framework: str, plan: Parallel, model: ModelSpec, samples: int) -> str | None:
    """Why `framework` cannot run `plan` (None: it can)."""
    cands = Candidates.of([plan])
    reasons = _rules(framework, cands, samples)
    for text, bad in reasons:
        if bool(bad[0]):
            return text.format(**plan.as_dict(), m=_microbatches(cands, samples)[0])
    return None


def supported(framework: str, cands: Candidates, model: ModelSpec, samples: int) -> np.ndarray:
    """True for each candidate `framework` can run."""
    ok = np.ones(len(cands), dtype=bool)
    for _, bad in _rules(framework, cands, samples):
        ok &= ~bad
    return ok


def _microbatches(cands: Candidates, samples: int) -> np.ndarray:
    per_replica = -(-samples // cands.dp)
    return -(-per_replica // cands.mbs)


def _rules(framework: str, c: Candidates, samples: int) -> list[tuple[str, np.ndarray]]:
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
        ]
    if framework == "torchtitan":
        return _torchtitan_rules(c, samples)
    return []


def _torchtitan_rules(c: Candidates, samples: int) -> list[tuple[str, np.ndarray]]:
    m = _microbatches(c, samples)
    rounds = np.maximum(1, m // c.pp)
    return [
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
