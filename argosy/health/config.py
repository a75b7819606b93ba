"""Config section of the health layer: probe sizes, expectations and verdict thresholds.

Every threshold the node checks use lives here, so an operator can tune them without
touching code. The CPU reference figures were measured on the development machine class
(a 2-core AMD EPYC KVM guest with AVX-512, two ranks of one thread each running at once);
`benchmarks/health.py --calibrate` measures them again on another machine.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CpuReference(BaseModel):
    """Per-rank figures a healthy CPU node reaches, measured with every rank running at once.

    The catalog's `cpu` entry is a nominal socket figure (1 TFLOP/s bf16, 50 GB/s), not a
    measurement, so a CPU node is compared with these figures instead.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    gemm_tflops: float = Field(0.092, gt=0)
    """fp32 GEMM throughput of one single-thread rank (n=768) per CPU-second, TFLOP/s."""
    memory_gbps: float = Field(19.5, gt=0)
    """Copy bandwidth (read + write bytes) of one single-thread rank per CPU-second, GB/s."""
    bus_gbps: float = Field(0.9, gt=0)
    """gloo all-reduce bus bandwidth (16 MiB, wall clock) between the node's ranks, GB/s."""
    measured_on: str = "2-core AMD EPYC KVM guest (AVX-512), 2 ranks, shared load, 2026-11-23"
    """Where and when the reference figures were measured."""


class NodePolicyConfig(BaseModel):
    """How evidence against a node turns into cordon, quarantine and return to service."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    window_s: float = Field(86_400.0, gt=0)
    """Evidence older than this no longer counts against a node."""
    cordon_score: float = Field(2.0, gt=0)
    """Score (weighted evidence in the window) at which a healthy node is cordoned."""
    quarantine_score: float = Field(4.0, gt=0)
    """Score at which a node is quarantined: out of service until repaired."""
    degraded_weight: float = Field(1.0, ge=0)
    """Weight of one degraded health check."""
    failed_weight: float = Field(4.0, ge=0)
    """Weight of one failed health check (the default quarantines at once)."""
    straggler_weight: float = Field(1.0, ge=0)
    """Weight of one straggler verdict of the runtime naming a device of the node."""
    fault_weight: float = Field(1.0, ge=0)
    """Weight of one fault (crash, hang) the runtime attributed to the node."""
    uncordon_after: int = Field(3, ge=1)
    """Consecutive healthy checks after which a cordoned node returns to service."""
    probation_checks: int = Field(2, ge=1)
    """Consecutive healthy checks after which a repaired node counts as healthy again."""


class HealthConfig(BaseModel):
    """How `argosy health check` probes a node and judges what it measures."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    degraded_below: float = Field(0.8, gt=0, le=1)
    """A measured/expected factor under this is degraded."""
    failed_below: float = Field(0.2, ge=0, lt=1)
    """A measured/expected factor under this is failed (a dead or crippled device)."""
    rounds: int = Field(7, ge=3)
    """Timed rounds per probe; every rank runs each round at the same time."""
    round_s: float = Field(0.12, gt=0)
    """Target seconds of work per rank in one round (the iteration count is sized to it)."""
    cpu_ranks: int | None = Field(None, ge=2)
    """Ranks on a node without accelerators, at least 2 (one rank has no peer); None uses
    min(cores, 4)."""
    gemm_n: int = Field(768, ge=64)
    """Matrix size of the GEMM probe on a CPU (fp32)."""
    gpu_gemm_n: int = Field(8192, ge=256)
    """Matrix size of the GEMM probe on an accelerator (bf16)."""
    gemm_fraction: float = Field(0.6, gt=0, le=1)
    """Share of the catalog's dense bf16 peak a healthy accelerator reaches in the probe."""
    memory_fraction: float = Field(0.8, gt=0, le=1)
    """Share of the catalog's memory bandwidth a healthy accelerator reaches in a copy."""
    bus_fraction: float = Field(0.4, gt=0, le=1)
    """Share of the catalog's scale-up link figure reached as all-reduce bus bandwidth."""
    host_copy_gbps: float = Field(20.0, gt=0)
    """Pinned host-device copy bandwidth expected per device, GB/s (PCIe Gen4 x16 ~25)."""
    memory_mib: int = Field(64, ge=1)
    """Buffer copied by the memory probe on a CPU, MiB."""
    gpu_memory_mib: int = Field(1024, ge=1)
    """Buffer copied by the memory probe on an accelerator, MiB."""
    gpu_host_copy_mib: int = Field(256, ge=1)
    """Pinned host buffer copied to the device and back by the host-copy probe, MiB."""
    bus_mib: int = Field(16, ge=1)
    """All-reduce message size on a CPU node, MiB."""
    gpu_bus_mib: int = Field(256, ge=1)
    """All-reduce message size on an accelerator node, MiB."""
    xid_window_s: float = Field(2.0, ge=0)
    """Seconds the vendor library is listened to for XID events (while the probes run)."""
    timeout_s: float = Field(120.0, gt=0)
    """Seconds the whole check may take before its ranks are stopped and it fails."""
    cpu: CpuReference = Field(default_factory=CpuReference)
    """Expectations of a CPU node (the catalog has no measured CPU figures)."""
    policy: NodePolicyConfig = Field(default_factory=NodePolicyConfig)
    """Node-record policy: cordon, quarantine and return-to-service thresholds."""

    @model_validator(mode="after")
    def _thresholds_in_order(self) -> HealthConfig:
        if self.failed_below >= self.degraded_below:
            raise ValueError(
                f"failed_below ({self.failed_below}) must be below degraded_below "
                f"({self.degraded_below})"
            )
        return self
