"""Cost-model constants per chip and for the framework, and the GEMM efficiency curve.

The constants live in `data/efficiency.yaml`: one set per chip (fitted to published
measurements where we have them, else the `default` set marked `assumed`) and one
framework set. `gemm_efficiency` is vectorised over numpy arrays:

    eff = gemm_max / (1 + half_flops / flops) / (1 + dim_half / min(m, n, k))
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from argosy.core.documents import load_yaml, validate

EFFICIENCY_PATH = Path(__file__).parent / "data" / "efficiency.yaml"


class ChipEfficiency(BaseModel):
    """How close one chip gets to its datasheet figures."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    gemm_max: float = Field(gt=0, le=1)
    """Fraction of dense peak reached by a large GEMM."""
    gemm_half_gflop: float = Field(gt=0)
    """GEMM size in GFLOP at which efficiency is half of `gemm_max`."""
    dim_half: float = Field(ge=0)
    """Smallest GEMM dimension at which efficiency is half of `gemm_max`."""
    attn_eff: float = Field(gt=0, le=1)
    """Fraction of peak reached by the attention core."""
    link_eff: float = Field(gt=0, le=1)
    """Fraction of per-direction scale-up bandwidth reached by collectives."""
    nic_eff: float = Field(gt=0, le=1)
    """Fraction of NIC bandwidth reached by collectives."""
    mem_eff: float = Field(gt=0, le=1)
    """Fraction of memory bandwidth reached by elementwise kernels."""
    coll_half_mb: float = Field(default=1.0, ge=0)
    """Collective message size (MB) at which a ring reaches half its bandwidth."""
    ring_base_us: float = Field(default=8.4, ge=0)
    """Latency of launching one ring collective, microseconds (NCCL's Simple protocol)."""
    link_step_us: float = Field(default=3.4, ge=0)
    """Latency of one ring step between devices of a node, microseconds."""
    nic_step_us: float = Field(default=9.6, ge=0)
    """Latency of one ring step between nodes, microseconds."""
    basis: Literal["fitted", "assumed"] = "assumed"
    """Whether the set was fitted to measurements or assumed."""


class Framework(BaseModel):
    """Constants of the training framework, shared by every chip."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    grad_bytes: float = 2
    """Bytes per gradient element in the data-parallel reduction."""
    elementwise_passes: float = 24
    """bf16 h-vector reads+writes per token per layer by memory-bound kernels."""
    score_passes: float = 4
    """Memory-bound passes over the attention scores per forward without flash attention."""
    backward_factor: float = 1.0
    """Backward time over twice the forward time (kernels of the backward are slower)."""
    tp_exposed: float = 1.0
    """Fraction of tensor-parallel collectives on the critical path."""
    p2p_exposed: float = 1.0
    """Fraction of pipeline send/recv on the critical path."""
    a2a_exposed: float = 1.0
    """Fraction of expert all-to-all on the critical path."""
    dp_overlap: float = 1.0
    """Fraction of the last micro-batch's backward that hides data-parallel traffic."""
    step_overhead_s: float = 0.05
    """Fixed time per step (optimizer launch, logging, data loading)."""
    straggler_per_doubling: float = 0.004
    """Relative step-time growth per doubling of data-parallel replicas."""
    reserved_gib: float = 3.0
    """Memory per device taken by runtime, workspace and fragmentation."""


class Constants(BaseModel):
    """Every constant of the cost model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: ChipEfficiency
    chips: dict[str, ChipEfficiency] = {}
    like: dict[str, str] = {}
    framework: Framework = Framework()

    def generation(self, chip_id: str) -> str:
        """The fitted chip `chip_id` shares silicon and kernels with (itself if none)."""
        return self.like.get(chip_id, chip_id)

    def chip(self, chip_id: str) -> ChipEfficiency:
        """The set for `chip_id`; else that of the chip it shares silicon with (`like`),
        marked assumed; else the default (assumed) set."""
        if chip_id in self.chips:
            return self.chips[chip_id]
        if chip_id in self.like and self.like[chip_id] in self.chips:
            return self.chips[self.like[chip_id]].model_copy(update={"basis": "assumed"})
        return self.default


@cache
def default_constants() -> Constants:
    """The constants shipped with argosy."""
    return validate(Constants, load_yaml(EFFICIENCY_PATH))


def gemm_efficiency(eff: ChipEfficiency, m, n, k) -> np.ndarray:
    """Fraction of peak for GEMMs of shape (m, n, k); arrays broadcast."""
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    flops = 2.0 * m * n * k
    smallest = np.minimum(np.minimum(m, n), k)
    size = 1.0 / (1.0 + eff.gemm_half_gflop * 1e9 / np.maximum(flops, 1.0))
    shape = 1.0 / (1.0 + eff.dim_half / np.maximum(smallest, 1.0))
    return eff.gemm_max * size * shape


def gemm_seconds(eff: ChipEfficiency, peak_flops: float, m, n, k) -> np.ndarray:
    """Seconds for one (m, n, k) GEMM on a chip of `peak_flops` FLOP/s."""
    flops = 2.0 * np.asarray(m, dtype=np.float64) * n * k
    return flops / (peak_flops * gemm_efficiency(eff, m, n, k))
