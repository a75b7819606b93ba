"""The one place the simulator calls the planner: MFU and scaling of a job on a chip.

    costs = PlanCosts()
    mfu, scaling = costs.efficiency("llama3-70b", "h100-sxm", 512, stock=False)

A job runs a model chosen by its kind and size (`job_model`). Its model-FLOPs
utilisation at N devices of one chip type comes from the planner's cost model
(`argosy.planner.api`), with either

- the planner's plan: the best plan `plan()` finds for that model, chip and size; or
- a *stock* plan: what a user copies from the framework's published example configs for
  that model size (NeMo / Megatron-LM Llama 3 recipes: 8B TP1 PP1 CP2; 70B TP4 PP4 CP2
  VPP5; data parallel over the rest), priced with `estimate()`; if it does not fit in
  the chip's memory, full recompute, then ZeRO-1, then the planner's own plan.

It is split into two factors that multiply back to the MFU at N devices:
single-chip efficiency = the best MFU the model reaches on that chip with that plan kind
at any power-of-two size from one node (8 devices) up to N, and scaling = MFU at N / that
best (at most 1: what growing to N costs). Sizes are priced at the nearest
power of two (MFU is smooth in N) and cached per (model, chip, size, plan kind), so a
month of simulation needs a few dozen planner calls. Jobs under one node are priced as
one node. Only this module imports the planner: a change of its signatures is a fix here.
"""

from __future__ import annotations

import math
from functools import cache

from argosy.core.errors import ArgosyError
from argosy.hardware.cluster import ClusterSpec, NodeGroupSpec, resolve

SEQ_LEN = 4096
MIN_BATCH = 512  # global batch in sequences: the recipes' 512, or one per device above it
STOCK: dict[str, dict[str, object]] = {
    "llama3-8b": {"tp": 1, "pp": 1, "cp": 2, "vpp": 1, "mbs": 1, "recompute": "none"},
    "llama3-70b": {"tp": 4, "pp": 4, "cp": 2, "vpp": 5, "mbs": 1, "recompute": "none"},
}
FALLBACKS: tuple[dict[str, object], ...] = ({}, {"recompute": "full"}, {"recompute": "full",
                                                                           "zero": 1})  # fmt: skip


def job_model(kind: str, max_devices: int) -> str:
    """The model a job of `kind` and nominal size trains: pretraining runs of 256 devices
    or more train a 70B model, everything else an 8B one (assumption)."""
    return "llama3-70b" if kind == "train" and max_devices >= 256 else "llama3-8b"


@cache
def state_bytes(kind: str, max_devices: int) -> float:
    """Training state (weights, gradients, Adam moments) of the model `job_model` picks:
    what a resize snapshots and restores (`argosy.scheduler.resize_cost`)."""
    from argosy.planner.models import load_model
    from argosy.scheduler.resize_cost import training_state_bytes

    return training_state_bytes(load_model(job_model(kind, max_devices)).total_params())


class PlanCosts:
    """MFU and scaling per (model, chip, size, plan kind), from the planner, cached."""

    def __init__(self, seq_len: int = SEQ_LEN) -> None:
        self.seq_len = seq_len
        self._known: dict[tuple[str, str, int, bool], tuple[float, float]] = {}

    def efficiency(
        self, model: str, chip: str, devices: int, *, stock: bool
    ) -> tuple[float, float]:
        """(single-chip efficiency, parallel scaling) of `model` on `devices` x `chip`
        (remembered per question: a job starts or resizes thousands of times a day)."""
        key = (model, chip, devices, stock)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = self._efficiency(model, chip, devices, stock)
        return known

    def _efficiency(self, model: str, chip: str, devices: int, stock: bool) -> tuple[float, float]:
        top = max(8, 1 << max(0, round(math.log2(max(devices, 1)))))
        sizes = [1 << k for k in range(3, int(math.log2(top)) + 1)]
        mfus = [_mfu(model, chip, n, stock, self.seq_len) for n in sizes]
        best = max(mfus)
        if best <= 0:  # nothing fits up to this size: price the smallest size that fits
            n = top * 2
            while n <= 1 << 20 and (m := _mfu(model, chip, n, stock, self.seq_len)) <= 0:
                n *= 2
            return (m if n <= 1 << 20 else 0.0), 1.0
        at_n = mfus[-1] if mfus[-1] > 0 else best
        return best, at_n / best


@cache
def _mfu(model: str, chip: str, devices: int, stock: bool, seq_len: int) -> float:
    """Predicted MFU of `model` on `devices` x `chip` (0 when nothing fits)."""
    from argosy.planner.api import estimate, plan
    from argosy.planner.models import load_model

    spec = load_model(model)
    cluster = resolve(ClusterSpec(groups=(NodeGroupSpec(chip=chip, count=devices),)))
    batch = max(MIN_BATCH, devices)
    if stock and model in STOCK:
        for change in FALLBACKS:
            mfu = _stock_mfu(estimate, spec, cluster, {**STOCK[model], **change}, seq_len, batch)
            if mfu > 0:
                return mfu
    result = plan(spec, cluster, seq_len, batch, top=1)
    return float(result["plans"][0]["predicted"]["mfu"]) if result["plans"] else 0.0


def _stock_mfu(estimate, spec, cluster, degrees: dict, seq_len: int, batch: int) -> float:  # noqa: ANN001
    from argosy.planner.parallel import Parallel

    n = cluster.num_devices
    inner = int(degrees["tp"]) * int(degrees["pp"]) * int(degrees["cp"])
    if n % inner:
        return 0.0
    try:
        plan = Parallel(**{**degrees, "dp": n // inner})
        out = estimate(spec, cluster, plan, seq_len, batch)
    except (ArgosyError, ValueError):  # degrees this size or model cannot take
        return 0.0
    return float(out["predicted"]["mfu"]) if out["feasible"] else 0.0
