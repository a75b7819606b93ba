"""Delivered model FLOPs against owned peak FLOPs, split into four factors that do not
overlap, so their product is exactly delivered / owned.

    ledger = FlopsLedger(cluster, horizon_s, costs, stock=False, serving_mfu=0.25)
    ledger.hold(+devices * peak); ledger.elapse(dt)        # allocation, continuously
    ledger.credit(device_s, peak, mfu, scaling)            # productive time of a job

Every quantity is weighted by the peak FLOP/s of the chip it ran on, so a mixed cluster
is weighed by what each chip can do:

    owned        sum over devices of peak x the period
    allocated    peak x time of devices held by a job or a replica
    productive   allocated time that moved work forward: not stalled (fault detection,
                 restart, reload, resize), not redone (work since the last checkpoint,
                 lost at a fault or preemption, is taken back), replicas the load needed
    model        productive x the job's single-chip efficiency (MFU)
    delivered    model x the job's parallel scaling

    resource_utilization     = allocated / owned
    effective_training_time  = productive / allocated
    single_chip_efficiency   = model / productive
    parallel_scaling         = delivered / model
    product                  = delivered / owned

The same prices set how fast a job progresses (`speed`): its trace work is in
device-seconds of the reference chip running the stock plan at the job's nominal size,
and it advances at (peak x MFU x scaling) / that reference per device-second.
"""

from __future__ import annotations

from argosy.hardware.catalog import default_catalog
from argosy.hardware.cluster import Cluster
from argosy.scheduler.speed import REFERENCE_CHIP
from argosy.scheduler.workload import Workload
from argosy.sim.plans import PlanCosts, job_model

LEAF_PENALTY = 0.05


class FlopsLedger:
    """Peak-weighted device-time sums of one simulation."""

    def __init__(
        self, cluster: Cluster, horizon_s: float, costs: PlanCosts, *, stock: bool,
        serving_mfu: float,
    ) -> None:  # fmt: skip
        self.peak = {g.chip.id: g.chip.peak_tflops("bf16") * 1e12 for g in cluster.groups}
        self.owned = sum(g.num_devices * self.peak[g.chip.id] for g in cluster.groups) * horizon_s
        self.costs, self.stock, self.serving_mfu = costs, stock, serving_mfu
        self.rate = 0.0  # peak FLOP/s held right now
        self.reference_peak = default_catalog().get(REFERENCE_CHIP).peak_tflops("bf16") * 1e12
        self._reference: dict[tuple[str, int], float] = {}
        self.allocated = self.productive = self.model = self.delivered = 0.0

    def hold(self, delta_flops: float) -> None:
        self.rate += delta_flops

    def elapse(self, dt: float) -> None:
        self.allocated += self.rate * dt

    def credit(self, device_s: float, peak: float, mfu: float, scaling: float) -> None:
        """Productive device-seconds (negative: work taken back)."""
        self.productive += device_s * peak
        self.model += device_s * peak * mfu
        self.delivered += device_s * peak * mfu * scaling

    def efficiency(self, w: Workload, devices: int, extra_leaves: float) -> tuple[float, float]:
        """(MFU, scaling) of `w` on `devices` of its chip; `extra_leaves` is the share of
        the leaf switches it spans beyond the fewest that could hold it."""
        model = job_model(w.kind, w.max_devices)
        mfu, scaling = self.costs.efficiency(model, w.chip or "", devices, stock=self.stock)
        return mfu, scaling * (1 - LEAF_PENALTY * extra_leaves)

    def speed(self, w: Workload, peak: float, mfu: float, scaling: float) -> float:
        """Progress per device-second of `w` running at (`peak`, `mfu`, `scaling`), in the
        trace's unit of work: device-seconds of the reference chip running the stock plan
        at the job's nominal size. A better plan, a faster chip or a tighter placement
        therefore finishes the same work sooner; 0 when the plan could not be priced."""
        ref = self.work_flops(w)
        return peak * mfu * scaling / ref if ref > 0 else 0.0

    def work_flops(self, w: Workload) -> float:
        """Model FLOPs of one unit of `w`'s trace work (a device-second of the reference
        chip running the stock plan at the job's nominal size)."""
        model = job_model(w.kind, w.max_devices)
        key = (model, w.max_devices)
        ref = self._reference.get(key)
        if ref is None:
            ref_mfu, ref_scaling = self.costs.efficiency(model, REFERENCE_CHIP, w.max_devices,
                                                         stock=True)  # fmt: skip
            ref = self._reference[key] = self.reference_peak * ref_mfu * ref_scaling
        return ref

    def factors(self) -> dict[str, float]:
        def ratio(a: float, b: float) -> float:
            return a / b if b > 0 else 0.0

        return {
            "resource_utilization": ratio(self.allocated, self.owned),
            "effective_training_time": ratio(self.productive, self.allocated),
            "single_chip_efficiency": ratio(self.model, self.productive),
            "parallel_scaling": ratio(self.delivered, self.model),
            "product": ratio(self.delivered, self.owned),
        }
