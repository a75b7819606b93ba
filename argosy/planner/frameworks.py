"""Training frameworks as data: what overlaps with what, what each ZeRO stage does, kernels.

Contract: `load_framework(name)` returns the frozen `Profile` read from
`data/frameworks/<name>.yaml` (aliases allowed); an unknown name raises
`UnknownNameError` listing the known ones. `FRAMEWORKS` lists the names; the default is
`megatron-core`. Each file carries its sources. The cost model reads from a profile:

- `overlap`: the fraction of each collective the framework hides behind compute (TP,
  gradient reduction, parameter gathers, pipeline send/recv, CP, expert all-to-all);
- `zero`: per ZeRO stage, which states are sharded and *when* gradients are reduced and
  parameters gathered: once per step (Megatron's distributed optimizer) or on every
  micro-batch (DeepSpeed ZeRO-2/3, FSDP);
- kernels: flash attention by default, the fraction of eager memory-bound time left after
  fusion (eager, and with `compile=1`), the cross-entropy kernel, GEMM-precision support;
- memory: bytes per parameter of weights, gradients and optimizer states, activation
  accounting (`megatron`: Korthikanti et al. 2022 with fused kernels; `eager`: what
  PyTorch autograd saves for an unfused Llama block; `hf`: the same counted for Hugging
  Face's LlamaForCausalLM), bytes per logit, lazily allocated gradients;
- `calibration`: the key its fitted parameters are stored under (frameworks sharing
  kernels share a key).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from argosy.core.documents import load_yaml, validate
from argosy.core.errors import UnknownNameError

FRAMEWORK_DIR = Path(__file__).parent / "data" / "frameworks"
CALIBRATED_PATH = Path(__file__).parent / "data" / "calibrated.yaml"
DEFAULT_FRAMEWORK = "megatron-core"
FRAMEWORKS = ("megatron-core", "megatron-lm", "deepspeed", "torchtitan", "pytorch")

_STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Overlap(BaseModel):
    """Fraction of each collective hidden behind compute when compute is long enough."""

    model_config = _STRICT

    interference: float = Field(default=0.0, ge=0, le=1)
    """Share of the hidden data-parallel traffic still added to the step: NCCL kernels
    take SMs and memory bandwidth from the compute they overlap."""
    tp: float = Field(default=0.0, ge=0, le=1)
    """Tensor-parallel all-reduce / all-gather / reduce-scatter."""
    grad_reduce: float = Field(default=0.0, ge=0, le=1)
    """Data-parallel gradient reduction, behind the backward."""
    param_gather: float = Field(default=0.0, ge=0, le=1)
    """Parameter all-gathers (distributed optimizer, ZeRO-3, FSDP), behind the forward."""
    p2p: float = Field(default=0.0, ge=0, le=1)
    """Pipeline send/recv."""
    cp: float = Field(default=1.0, ge=0, le=1)
    """Context-parallel K/V ring exchange, behind the attention core."""
    ep: float = Field(default=0.0, ge=0, le=1)
    """Expert all-to-all."""


class ZeroStage(BaseModel):
    """What one ZeRO stage means in this framework."""

    model_config = _STRICT

    shard: list[Literal["optimizer", "grads", "weights"]] = []
    """States sharded over the data-parallel group."""
    grad_reduce: Literal["step", "microbatch"] = "step"
    """When gradients cross the data-parallel group: once per step, or every micro-batch."""
    grad_op: Literal["all_reduce", "reduce_scatter"] = "all_reduce"
    """The gradient collective."""
    param_gather: Literal["none", "step", "microbatch"] = "none"
    """When parameters are all-gathered: never, once per step, or every micro-batch."""
    gathers_per_microbatch: int = Field(default=1, ge=1, le=3)
    """Parameter all-gathers per micro-batch (2 when the forward reshards them)."""
    calls_per_layer: float = Field(default=1.0, gt=0)
    """Collective calls per layer for each per-micro-batch gather or reduction (FSDP
    gathers a block at once: 1; DeepSpeed ZeRO-3 one submodule at a time): each call
    pays a ring's latency, which grows with the data-parallel size."""
    overlap_grad: float | None = Field(default=None, ge=0, le=1)
    """This stage's gradient-reduction overlap, where it differs from the profile's."""
    overlap_param: float | None = Field(default=None, ge=0, le=1)
    """This stage's parameter-gather overlap, where it differs from the profile's."""
    note: str = ""
    """Where the semantics are documented."""


class Selective(BaseModel):
    """What `recompute=selective` recomputes in this framework, as fractions of the forward."""

    model_config = _STRICT

    gemm: float = Field(default=0.0, ge=0, le=1)
    """Share of the forward GEMMs recomputed."""
    attention: float = Field(default=1.0, ge=0, le=1)
    """Share of the attention core recomputed."""
    elementwise: float = Field(default=0.0, ge=0, le=1)
    """Share of the memory-bound forward ops recomputed."""
    kept: float = Field(default=1.0, gt=0, le=1)
    """Share of the layer's activation bytes still stored (scores aside)."""


class Memory(BaseModel):
    """Bytes the framework keeps per parameter and how it stores activations."""

    model_config = _STRICT

    weight_bytes: float = 2.0
    """Bytes per parameter of the weights used by compute (bf16)."""
    master_bytes: float = 0.0
    """Bytes per parameter of an fp32 master copy kept beside the bf16 weights."""
    grad_bytes: float = 4.0
    """Bytes per parameter of the accumulated gradients."""
    optimizer_bytes: float = 12.0
    """Bytes per parameter of optimizer states (with the master copy when it is sharded)."""
    activations: Literal["megatron", "eager", "hf"] = "megatron"
    """Activation accounting (`memory.activation_bytes_per_layer`)."""
    lazy_grads: bool = False
    """Gradients are allocated by the first backward and freed after the step
    (`zero_grad(set_to_none=True)`, no DDP buckets): on one device with one micro-batch
    the loss's peak comes before they exist."""
    logits_bytes_per_vocab: float = 4.0
    """Bytes per token and vocabulary entry at the loss (logits, their gradient)."""
    compiled_activations: float = Field(default=1.0, gt=0, le=1)
    """Share of the activation bytes still saved with `compile=1` (fused norms and MLP
    activation save their bf16 inputs only)."""
    fp8_activations: float = Field(default=0.75, gt=0, le=1)
    """Share of the activation bytes still saved with `fp8=1` (Transformer Engine keeps
    fp8 GEMM inputs: about a quarter less)."""
    compiled_logits_bytes_per_vocab: float | None = None
    """Bytes per token and vocabulary entry at the loss with `compile=1` (default: as eager)."""
    reserve_fraction: float = Field(default=0.05, ge=0, lt=1)
    """Allocator reserve over the allocated peak (caching-allocator fragmentation)."""
    runtime_gib: float = 1.0
    """Device memory taken by the CUDA context, communicator buffers and workspaces."""


class Profile(BaseModel):
    """One training framework."""

    model_config = _STRICT

    name: str
    """Canonical name."""
    title: str = ""
    """What the profile describes (framework and era)."""
    aliases: list[str] = []
    """Other names accepted on the command line."""
    sources: list[str] = []
    """Where each behaviour was read."""
    calibration: str = ""
    """Key of the fitted parameters (defaults to the name)."""
    kernels: str = ""
    """Calibration key whose fitted compute scale this framework borrows because it runs
    that framework's kernels (Megatron-DeepSpeed runs Megatron-LM's); empty: its own."""
    flash_attention: bool = True
    """Whether attention runs as a fused flash kernel unless the plan says otherwise."""
    interleaved_pipeline: bool = True
    """Whether virtual pipeline stages (vpp > 1) exist in this framework."""
    context_parallel: bool = True
    partial_recompute: bool = False
    """Full recompute of only the first k layers of each model chunk (Megatron's
    `--recompute-method block --recompute-num-layers k`): the planner recomputes as few
    layers as fit, where recomputing none does not."""
    """Whether context parallelism (cp > 1) exists in this framework."""
    tp_comm_in_bf16: bool = True
    """Whether TP activations travel in bf16 (else fp32)."""
    p2p_split_by_tp: bool = True
    """Whether each TP rank sends only its 1/tp slice between pipeline stages (Megatron's
    scatter/gather); DeepSpeed's pipeline engine sends the whole activation from every rank."""
    recompute_gathers: int = Field(default=0, ge=0)
    """Extra TP all-gathers per layer and micro-batch under recompute (DeepSpeed's
    partition_activations splits the checkpoints across TP ranks and gathers them back)."""
    elementwise_eager: float = Field(default=1.0, gt=0)
    """Memory-bound time relative to eager PyTorch ops (norms, SwiGLU/GeLU, RoPE, residuals)."""
    elementwise_compiled: float = Field(default=0.6, gt=0)
    """The same with `compile=1`."""
    cross_entropy: float = Field(default=1.0, gt=0)
    """Loss time relative to an eager cross-entropy over fp32-upcast logits."""
    score_passes: float = Field(default=8.0, ge=0)
    """bf16 passes over the attention scores per forward+backward without flash attention."""
    extra_passes: float = Field(default=6.0, ge=0)
    """Other bf16 passes over the hidden state per token and layer (residuals, RoPE, dropout)."""
    moe_token_expert_ns: float = Field(default=0.0, ge=0)
    """Routing work per MoE layer, forward+backward, in nanoseconds per token and local
    expert (permutation, per-expert chunking and quantization, router): fitted on
    published MoE runs (`benchmarks/planner_unfitted.py --fit`); 0 where none was measured."""
    grad_comm_bytes: float = 4.0
    """Bytes per gradient element in the data-parallel reduction."""
    param_comm_bytes: float = 2.0
    """Bytes per parameter element in parameter all-gathers."""
    fp8_param_comm_bytes: float | None = None
    """The same with `fp8=1` where the framework gathers fp8 weights (torchtitan)."""
    optimizer_bytes_moved: float = 30.0
    """Bytes of optimizer-step memory traffic per parameter it updates."""
    step_overhead_s: float = Field(default=0.02, ge=0)
    """Fixed time per step (launches, logging, data loading), before calibration."""
    straggler_per_doubling: float = Field(default=0.004, ge=0)
    """Relative step-time growth per doubling of data-parallel replicas."""
    overlap: Overlap = Overlap()
    """Which collectives hide behind which compute."""
    selective: Selective = Selective()
    """What selective recompute repeats and keeps (Megatron: the attention core)."""
    zero: dict[int, ZeroStage]
    """ZeRO stage 0-3 as this framework runs it."""
    memory: Memory = Memory()
    """Per-parameter state bytes and activation accounting."""

    @property
    def key(self) -> str:
        return self.calibration or self.name

    def stage(self, zero: int) -> ZeroStage:
        return self.zero[zero]

    def distinct_zero_stages(self) -> tuple[int, ...]:
        """The stages that differ from every lower one (a stage that behaves exactly as
        a lower one would only repeat its rows in a ranking)."""
        kept: list[int] = []
        for z in sorted(self.zero):
            this = self.zero[z].model_dump(exclude={"note"})
            if all(self.zero[k].model_dump(exclude={"note"}) != this for k in kept):
                kept.append(z)
        return tuple(kept)


@cache
def _profiles() -> dict[str, Profile]:
    out: dict[str, Profile] = {}
    for path in sorted(FRAMEWORK_DIR.glob("*.yaml")):
        profile = validate(Profile, load_yaml(path))
        out[profile.name] = profile
        for alias in profile.aliases:
            out[alias] = profile
    return out


def known_frameworks() -> list[str]:
    """Canonical framework names."""
    return sorted({p.name for p in _profiles().values()})


def load_framework(name: str | Profile | None = None) -> Profile:
    """The profile called `name` (default `megatron-core`)."""
    if isinstance(name, Profile):
        return name
    key = (name or DEFAULT_FRAMEWORK).strip().lower()
    profiles = _profiles()
    if key not in profiles:
        raise UnknownNameError("framework", name or "", known_frameworks())
    return profiles[key]


class Scales(BaseModel):
    """Fitted multipliers of one framework x chip generation (`data/calibrated.yaml`)."""

    model_config = _STRICT

    compute: float = Field(default=1.0, gt=0)
    """Multiplier on kernel time (GEMMs, attention, memory-bound ops)."""
    comm: float = Field(default=1.0, gt=0)
    """Multiplier on collective and send/recv time."""
    overhead: float = Field(default=1.0, ge=0)
    """Multiplier on the profile's fixed step overhead."""
    points: int = 0
    """Published runs the scales were fitted on (0: not fitted, defaults)."""
    sources: list[str] = []
    """Their sources."""


class _Calibrated(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    fitted: dict[str, dict[str, Scales]] = {}


@cache
def _calibrated() -> dict[str, dict[str, Scales]]:
    if not CALIBRATED_PATH.exists():
        return {}
    return validate(_Calibrated, load_yaml(CALIBRATED_PATH)).fitted


def fitted_scales(key: str, generation: str) -> Scales:
    """The fitted scales of calibration key `key` on chip generation `generation`; where
    no published run covers the pair, the generation's pooled fit (`any`), else
    the defaults (1.0, not fitted)."""
    fitted = _calibrated()
    found = fitted.get(key, {}).get(generation) or fitted.get("any", {}).get(generation)
    return found or Scales()
