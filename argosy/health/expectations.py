"""What a healthy device of a given chip should measure in each probe.

Accelerators: a share of the chip's catalog figures (dense bf16 peak, memory bandwidth,
scale-up link), the shares set in `HealthConfig`. The host-device copy has no catalog
figure, so a config floor is used. CPU nodes: the catalog's `cpu` entry is nominal, so the
reference measured on this machine class (`HealthConfig.cpu`) is used instead.

    expect = expectations(default_catalog().get("h100"), HealthConfig())
    expect.gemm_tflops   # 593.4 = 989 x 0.6
"""

from __future__ import annotations

from dataclasses import dataclass

from argosy.hardware.catalog import Chip
from argosy.health.config import HealthConfig


@dataclass(frozen=True)
class Expectations:
    """Per-device figures of a healthy device; None where the probe does not apply."""

    chip_id: str
    gemm_tflops: float
    memory_gbps: float
    bus_gbps: float
    host_copy_gbps: float | None
    basis: str
    """How the figures were obtained, printed with the report."""


def expectations(chip: Chip, config: HealthConfig) -> Expectations:
    """The expectations for `chip` (a catalog entry) under `config`."""
    if chip.vendor == "cpu":
        ref = config.cpu
        return Expectations(
            chip_id=chip.id,
            gemm_tflops=ref.gemm_tflops,
            memory_gbps=ref.memory_gbps,
            bus_gbps=ref.bus_gbps,
            host_copy_gbps=None,
            basis=f"CPU reference measured on {ref.measured_on} (catalog cpu entry is nominal)",
        )
    return Expectations(
        chip_id=chip.id,
        gemm_tflops=chip.peak_tflops("bf16") * config.gemm_fraction,
        memory_gbps=chip.memory_tbps * 1000 * config.memory_fraction,
        bus_gbps=chip.link.gbps * config.bus_fraction,
        host_copy_gbps=config.host_copy_gbps,
        basis=(
            f"catalog {chip.id}: {config.gemm_fraction:g} x bf16 peak, "
            f"{config.memory_fraction:g} x memory bandwidth, {config.bus_fraction:g} x "
            f"{chip.link.kind} link; host copy floor {config.host_copy_gbps:g} GB/s"
        ),
    )
