"""The search space: every parallel configuration worth pricing, pruned, as columns.

Pruning rules (each one a rule of thumb from Megatron-LM and the planners in
reference/planner_notes.md): TP is a power of two inside one scale-up domain and divides
heads and kv-heads; PP is at most the layer count; interleaving needs PP > 1 and at least
one layer per virtual chunk; CP divides seq-len/2; EP divides experts and dp*cp; sequence
parallelism is on whenever TP > 1; micro-batches divide each replica's share of the batch.
`fixed` pins any field (the published part of a configuration).
"""

from __future__ import annotations

import itertools

import numpy as np

from argosy.planner.models import ModelSpec
from argosy.planner.parallel import RECOMPUTE, Candidates, expert_holders

MBS = (1, 2, 4, 8)
VPP = (1, 2, 3, 4, 6, 8)
CP = (1, 2, 4, 8, 16, 32)
ZERO = (0, 1, 2, 3)


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def enumerate_space(
    model: ModelSpec,
    devices: int,
    domain_size: int,
    seq_len: int,
    samples: int,
    fixed: dict[str, object] | None = None,
    exact_batch: bool = True,
    flash_default: bool = True,
    interleaved: bool = True,
    zero_stages: tuple[int, ...] = ZERO,
) -> Candidates:
    """All pruned candidates for `devices` of one chip type processing `samples` per step.

    With `exact_batch`, dp*mbs must divide `samples`; otherwise replicas may take
    unequal shares (used inside mixed clusters). `zero_stages` are the ZeRO stages worth
    trying (a framework whose stage 2 behaves as stage 1 leaves 2 out)."""
    fixed = dict(fixed or {})
    tps = [
        t
        for t in _powers_of_two(min(domain_size, devices))
        if model.heads % t == 0 and model.kv % t == 0
    ]
    cps = [c for c in CP if c == 1 or (seq_len % (2 * c) == 0 and seq_len // c >= 512)]
    eps = [e for e in _divisors(model.experts) if e <= devices] if model.is_moe else [1]
    rows = []
    for tp, cp in itertools.product(_pick(fixed, "tp", tps), _pick(fixed, "cp", cps)):
        if devices % (tp * cp):
            continue
        for pp in _pick(
            fixed, "pp", [p for p in _divisors(devices // (tp * cp)) if p <= model.layers]
        ):
            dp = devices // (tp * cp * pp)
            if "dp" in fixed and fixed["dp"] != dp:
                continue
            rows.extend(
                _inner(
                    model,
                    fixed,
                    tp,
                    cp,
                    pp,
                    dp,
                    eps,
                    samples,
                    exact_batch,
                    interleaved,
                    zero_stages,
                )  # fmt: skip
            )
    if not rows:
        return Candidates.of([])
    arr = np.asarray(rows, dtype=np.int64)
    sp = fixed.get("sp")
    sp_col = arr[:, 0] > 1 if sp is None else np.full(len(arr), bool(sp))
    flash = np.full(len(arr), bool(fixed.get("flash", flash_default)))
    compiled = np.full(len(arr), bool(fixed.get("compile", False)))
    fp8 = np.full(len(arr), bool(fixed.get("fp8", False)))
    rlayers = int(fixed.get("recompute_layers") or 0)  # type: ignore[call-overload]
    return Candidates(
        tp=arr[:, 0], pp=arr[:, 1], dp=arr[:, 2], vpp=arr[:, 3], mbs=arr[:, 4],
        recompute=arr[:, 5], zero=arr[:, 6], cp=arr[:, 7], ep=arr[:, 8], etp=arr[:, 9],
        sp=sp_col, flash=flash,
        compile=compiled, fp8=fp8, recompute_layers=np.where(arr[:, 5] == 2, rlayers, 0),
    )  # fmt: skip


def _inner(
    model, fixed, tp, cp, pp, dp, eps, samples, exact_batch, interleaved, zeros
) -> list[tuple[int, ...]]:
    vpps = [v for v in VPP if v == 1 or (interleaved and pp > 1 and v * pp <= model.layers)]
    mbss = [
        m for m in MBS if (samples % (dp * m) == 0 if exact_batch else m * dp <= max(samples, dp))
    ]
    recs = [RECOMPUTE.index(r) for r in _pick(fixed, "recompute", list(RECOMPUTE))]
    rows = []
    # routed experts split over TP (etp 0: as tp) or whole (etp 1, ep may span TP ranks)
    etps = _pick(fixed, "etp", [0, 1] if model.is_moe and tp > 1 else [0])
    for vpp, mbs, ep, etp in itertools.product(
        _pick(fixed, "vpp", vpps), _pick(fixed, "mbs", mbss), _pick(fixed, "ep", eps), etps
    ):
        if expert_holders(dp, cp, tp, etp) % ep:
            continue
        for rec, zero in itertools.product(recs, _pick(fixed, "zero", list(zeros))):
            if zero and dp * cp == 1:
                continue
            rows.append((tp, pp, dp, vpp, mbs, rec, zero, cp, ep, etp))
    return rows


def _pick(fixed: dict[str, object], key: str, options: list) -> list:
    if key in fixed and fixed[key] is not None:
        return [fixed[key]]
    return options
