"""Block-method partial recompute: recompute as few layers as fit.

Contract: `partial_candidates(model, hw, seq_len, cands, costs, samples, ...)` takes priced
candidates and returns new ones (never changes the given ones). For each candidate with
full recompute of every layer that fits, where the same plan with no recompute does not,
it proposes the plan that recomputes only the first k layers of each model chunk
(Megatron's `--recompute-method block --recompute-num-layers k`) for the smallest k that
memory predicts fits, and k + 1 (per-device memory is linear in k on each pipeline
stage, but the fuller of the first and last stage may change with k). Rows whose k would
be every layer of the chunk are dropped: that is the full-recompute row itself. The
caller prices the new rows with the cost model like any other; those that do not fit
are dropped there. Frameworks whose profile lacks `partial_recompute` get none.
"""

from __future__ import annotations

import numpy as np

from argosy.planner.costmodel import Costs, Hardware, evaluate
from argosy.planner.efficiency import Constants
from argosy.planner.frameworks import Profile, Scales
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Candidates


def partial_candidates(
    model: ModelSpec,
    hw: Hardware,
    seq_len: int,
    cands: Candidates,
    costs: Costs,
    samples: int,
    fw: Profile,
    constants: Constants | None = None,
    scales: Scales | None = None,
) -> Candidates:
    """Plans recomputing the fewest layers that fit (see the module docstring)."""
    full = np.flatnonzero((cands.recompute == 2) & (cands.recompute_layers == 0) & costs.fits)
    if not fw.partial_recompute or len(full) == 0:
        return cands.take(np.zeros(0, dtype=np.int64))
    base = cands.take(full)
    plain = base.take(slice(None))  # a copy: the same plans without recompute
    plain.recompute = np.zeros(len(base), dtype=np.int64)
    none = evaluate(model, hw, seq_len, plain, samples / plain.dp, constants, fw, scales)
    mem0, mem1 = none.memory_gib, costs.memory_gib[full]
    chunk = np.ceil(model.layers / (base.pp * base.vpp)).astype(np.int64)
    need = (mem0 - costs.capacity_gib) / np.maximum(mem0 - mem1, 1e-9)
    k = np.ceil(need * chunk).astype(np.int64)
    rows, ks = [], []
    for extra in (0, 1):
        kk = np.maximum(k + extra, 1)
        ok = np.flatnonzero((mem0 > costs.capacity_gib) & (kk < chunk))
        rows.append(ok)
        ks.append(kk[ok])
    out = base.take(np.concatenate(rows))
    out.recompute_layers = np.concatenate(ks)
    return out
