"""Relative throughput of a chip: the one seam through which heterogeneity enters.

Workloads that accept several chip types are compared by effective throughput
(devices x relative speed), never by device count. The planner's cost model is used
when it provides `argosy.planner.relative_speed(chip_id)`; until then a chip's speed is
its dense bf16 peak times a per-vendor software-efficiency factor, relative to the
reference chip (h100-sxm = 1.0), for a representative model (`SPEED_MODEL`, a dense 8B
transformer at 4k tokens: the planner's cost model, tokens/s per device). Without the
planner the fallback factors are assumptions, stated here:

    nvidia 1.00 (reference stack), amd 0.80, huawei 0.75, intel 0.75, others 0.70.
"""

from __future__ import annotations

from functools import cache

from argosy.hardware.catalog import default_catalog

REFERENCE_CHIP = "h100-sxm"
SPEED_MODEL = "llama3-8b"
VENDOR_EFFICIENCY: dict[str, float] = {
    "nvidia": 1.0,
    "amd": 0.8,
    "huawei": 0.75,
    "intel": 0.75,
}
DEFAULT_EFFICIENCY = 0.7


@cache
def relative_speed(chip_id: str) -> float:
    """Throughput of one `chip_id` device relative to one reference device."""
    planner_speed = _planner_speed()
    if planner_speed is not None:
        return float(planner_speed(SPEED_MODEL, chip_id))
    catalog = default_catalog()
    chip, ref = catalog.get(chip_id), catalog.get(REFERENCE_CHIP)
    eff = VENDOR_EFFICIENCY.get(chip.vendor, DEFAULT_EFFICIENCY)
    return (chip.bf16_tflops or 1.0) * eff / (ref.bf16_tflops or 1.0)


def _planner_speed():  # noqa: ANN202  # a callable when the planner exposes one
    try:
        from argosy.planner import relative_speed as planner_relative_speed
    except ImportError:
        return None
    return planner_relative_speed
