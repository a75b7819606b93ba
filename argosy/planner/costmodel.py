"""Step time, FLOPs and memory of many candidate plans on one chip group, vectorised.

Contract: `evaluate(model, hw, seq_len, cands, samples_per_replica, framework=...)`
returns a `Costs` whose arrays line up with `cands`; the `breakdown` terms add up to
`step_s` exactly. Pure numpy (no torch), microseconds per candidate. Per device and
micro-batch, on the slowest pipeline stage:

- compute: every GEMM after the TP/CP/EP split at the chip's measured forward+backward
  efficiency for that (m, n, k) (`measured.py`; chips without a table use the parametric
  curve of `efficiency.yaml`), fp8 GEMMs faster by the measured fp8/bf16 ratio; causal
  flash attention at its measured efficiency for the sequence length (or, without flash
  attention, matmuls plus memory-bound passes over the scores); norms, the MLP
  activation, residuals/RoPE and the loss at the measured seconds per element, scaled by
  what the framework fuses (eager, `compile=1`, Transformer Engine);
- recompute: full repeats the forward (of the recomputed share of layers under the
  block method), selective the attention core;
- TP/SP, CP and EP collectives, and PP send/recv, each minus the share the framework's
  profile overlaps with compute;
- pipeline bubble: (pp - 1) / vpp micro-batch times;
- data parallel, by the framework's ZeRO semantics: gradients all-reduced or
  reduce-scattered and parameters all-gathered once per step (hidden behind the last
  backward / first forward) or on every micro-batch (hidden behind that micro-batch);
  rings run at the scale-up link when the group sits in one node (a data-parallel
  group's members are tp devices apart), else at the NIC per device; hidden
  traffic still costs `overlap.interference` of its time (NCCL kernels share the SMs);
- optimizer step at the measured fused-AdamW bandwidth; a fixed overhead; a straggler
  term growing with the log of data-parallel replicas.
The fitted `compute` and `comm` scales of the framework x chip generation
(`data/calibrated.yaml`) multiply the kernel and collective times.

FLOP convention: `model_flops` counts matmuls and full (unmasked) attention scores,
3x forward, no recompute (for MFU); `hardware_flops` adds what recompute repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from argosy.hardware.cluster import NodeGroup
from argosy.planner.efficiency import (
    ChipEfficiency,
    Constants,
    default_constants,
    gemm_efficiency,
)
from argosy.planner.frameworks import Profile, Scales, fitted_scales, load_framework
from argosy.planner.measured import Measured, tables_for
from argosy.planner.memory import (
    GIB,
    Memory,
    memory,
    stage_expert_params,
    stage_layers,
    stage_params,
    state_params,
)
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Candidates

H100_BPS = 3.35e12  # the measured per-element costs are scaled by bandwidth for other chips
BREAKDOWN = (
    "compute",
    "recompute",
    "tp",
    "cp",
    "ep",
    "pp",
    "bubble",
    "dp",
    "optimizer",
    "overhead",
)


@dataclass(frozen=True)
class Hardware:
    """What the cost model needs of one chip group."""

    chip_id: str
    peak_flops: float
    memory_gib: float
    memory_bps: float
    link_bps: float  # per direction, bytes/s
    domain_size: int
    devices_per_node: int
    nic_bps: float  # bytes/s per device
    eff: ChipEfficiency
    generation: str = ""
    measured: Measured | None = None

    @classmethod
    def of(
        cls, group: NodeGroup, constants: Constants | None = None, dtype: str = "bf16"
    ) -> Hardware:
        chip = group.chip
        constants = constants or default_constants()
        generation = constants.generation(chip.id)
        return cls(
            chip_id=chip.id,
            peak_flops=chip.peak_tflops(dtype) * 1e12,  # type: ignore[arg-type]
            memory_gib=chip.memory_gib,
            memory_bps=chip.memory_tbps * 1e12,
            link_bps=chip.link.gbps * 1e9 / 2,
            domain_size=group.domain_size,
            devices_per_node=group.devices_per_node,
            nic_bps=group.nic_gbps * 1e9 / 8,
            eff=constants.chip(chip.id),
            generation=generation,
            measured=tables_for(chip.id) or tables_for(generation),
        )

    @property
    def elem_scale(self) -> float:
        """Measured per-element costs are from the table's chip; others scale by bandwidth."""
        return (
            1.0
            if self.measured and self.measured.chip_id == self.chip_id
            else (H100_BPS / self.memory_bps)
        )


@dataclass
class Costs:
    """Arrays aligned with the candidates: seconds per step and its parts, FLOPs, memory."""

    step_s: np.ndarray
    compute_s: np.ndarray
    recompute_s: np.ndarray
    tp_s: np.ndarray
    cp_s: np.ndarray
    ep_s: np.ndarray
    pp_s: np.ndarray
    bubble_s: np.ndarray
    dp_s: np.ndarray
    optimizer_s: np.ndarray
    overhead_s: np.ndarray
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    memory: Memory
    capacity_gib: float

    @property
    def memory_gib(self) -> np.ndarray:
        return self.memory.total / GIB

    @property
    def fits(self) -> np.ndarray:
        return self.memory_gib <= self.capacity_gib

    def concat(self, other: Costs) -> Costs:
        """These candidates' costs followed by `other`'s (same chip group)."""
        arrays = {
            f.name: np.concatenate([getattr(self, f.name), getattr(other, f.name)])
            for f in fields(self)
            if f.name not in ("memory", "capacity_gib")
        }
        memory = Memory(
            **{
                f.name: np.concatenate(
                    [getattr(self.memory, f.name), getattr(other.memory, f.name)]
                )
                for f in fields(Memory)
            }
        )
        return Costs(**arrays, memory=memory, capacity_gib=self.capacity_gib)

    def breakdown(self, i: int) -> dict[str, float]:
        """Seconds of each part of candidate `i`'s step; they add up to `step_s[i]`."""
        return {name: float(getattr(self, f"{name}_s")[i]) for name in BREAKDOWN}


@dataclass
class _MicroBatch:
    """Seconds of one micro-batch on one device, per layer (arrays) and for the LM head."""

    fwd: np.ndarray  # forward compute of one layer
    bwd: np.ndarray  # backward compute of one layer
    rec: np.ndarray  # recompute of one layer
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    head: np.ndarray  # LM head + loss, forward and backward

    @property
    def layer(self) -> np.ndarray:
        return self.fwd + self.bwd + self.rec + self.tp + self.cp + self.ep


def evaluate(
    model: ModelSpec,
    hw: Hardware,
    seq_len: int,
    c: Candidates,
    samples_per_replica,
    constants: Constants | None = None,
    framework: Profile | str | None = None,
    scales: Scales | None = None,
) -> Costs:
    """Costs of every candidate when each replica processes `samples_per_replica`."""
    fw = load_framework(framework)
    sc = scales or fitted_scales(fw.key, hw.generation)
    samples = np.asarray(samples_per_replica, dtype=np.float64) * np.ones(len(c))
    nmb = np.maximum(np.ceil(samples / c.mbs), 1.0)
    tokens = c.mbs * seq_len / c.cp
    mb = _microbatch(model, hw, fw, sc, seq_len, c)
    chunk_layers = np.ceil(model.layers / (c.pp * c.vpp))
    body = chunk_layers * c.vpp
    # the slowest stage: a full chunk set, or an even share of layers plus the LM head
    with_head = (model.layers * mb.layer + mb.head) / c.pp
    uneven = body * mb.layer >= with_head
    share = np.where(uneven, 1.0, model.layers / (c.pp * body))  # layers moved off the head
    per = {k: getattr(mb, k) * body * share for k in ("fwd", "bwd", "rec", "tp", "cp", "ep")}
    head_share = np.where(uneven, 0.0, mb.head / c.pp)
    fwd_stage = per["fwd"] + head_share / 3.0
    bwd_stage = per["bwd"] + head_share * 2.0 / 3.0
    pp_s = _p2p_s(model, hw, fw, sc, c, tokens)
    per_mb = fwd_stage + bwd_stage + per["rec"] + per["tp"] + per["cp"] + per["ep"] + pp_s
    bubble = np.where(c.pp > 1, (c.pp - 1) / c.vpp * per_mb, 0.0)
    dp_s = _dp_s(model, hw, fw, sc, c, nmb, fwd_stage, bwd_stage)
    opt = _optimizer_s(model, hw, fw, c)
    base = nmb * per_mb + bubble + dp_s + opt
    jitter = fw.straggler_per_doubling * np.log2(c.dp * c.cp)
    overhead = fw.step_overhead_s * sc.overhead + jitter * (base + fw.step_overhead_s)
    step = base + overhead
    flops_tok = model.forward_flops_per_token(seq_len)
    total_tokens = samples * c.dp * seq_len
    model_flops = 3.0 * flops_tok * total_tokens
    extra = np.select(
        [c.recompute == 2, c.recompute == 1],
        [
            (flops_tok - 2.0 * model.vocab * model.hidden) * c.recompute_share(model.layers),
            4.0 * seq_len * model.hidden * model.layers,
        ],
        0.0,
    )
    mem = memory(model, c, seq_len, nmb, fw)
    return Costs(
        step_s=step,
        compute_s=nmb * (fwd_stage + bwd_stage),
        recompute_s=nmb * per["rec"],
        tp_s=nmb * per["tp"],
        cp_s=nmb * per["cp"],
        ep_s=nmb * per["ep"],
        pp_s=nmb * pp_s,
        bubble_s=bubble,
        dp_s=dp_s,
        optimizer_s=opt,
        overhead_s=overhead,
        model_flops=model_flops,
        hardware_flops=model_flops + extra * total_tokens,
        memory=mem,
        capacity_gib=hw.memory_gib,
    )


def microbatch_times(
    model: ModelSpec,
    hw: Hardware,
    seq_len: int,
    c: Candidates,
    constants=None,
    framework: Profile | str | None = None,
):
    """Seconds of one layer (forward, backward, recompute, TP/CP/EP traffic) and of the
    LM head for one micro-batch on one device; also the TP, CP and EP parts of a layer."""
    fw = load_framework(framework)
    mb = _microbatch(model, hw, fw, fitted_scales(fw.key, hw.generation), seq_len, c)
    return mb.layer, mb.head, (mb.tp, mb.cp, mb.ep)


def _microbatch(model, hw: Hardware, fw: Profile, sc: Scales, seq_len, c) -> _MicroBatch:
    tokens = c.mbs * seq_len / c.cp
    gemm, attn, elem, fwd_share = _layer_compute(model, hw, fw, c, tokens, seq_len)
    total = (gemm + attn + elem) * sc.compute
    fwd = total * fwd_share
    attn_fwd = attn * sc.compute / 3.5
    sel = fw.selective
    selective = (sel.gemm * gemm / 3.0 + sel.elementwise * elem / 3.0) * sc.compute
    selective = selective + sel.attention * attn_fwd
    rec = np.where(c.recompute == 1, selective, fwd * c.recompute_share(model.layers))
    return _MicroBatch(
        fwd=fwd,
        bwd=total - fwd,
        rec=rec,
        tp=_tp_s(model, hw, fw, sc, c, tokens),
        cp=_cp_s(model, hw, fw, sc, c, tokens, attn_fwd),
        ep=_ep_s(model, hw, fw, sc, c, tokens),
        head=_head_s(model, hw, fw, c, tokens) * sc.compute,
    )


def _gemm_fb_s(hw: Hardware, m, n, k, fp8) -> np.ndarray:
    """Forward+backward seconds of a linear layer (m tokens, weight n x k). In fp8 the
    GEMMs run faster by the measured fp8/bf16 ratio, and the input and output gradient
    are quantized on the way in (read bf16, write fp8 and its transpose: 4 bytes per
    element; weights are quantized once per step, so not per micro-batch)."""
    m = np.asarray(m, dtype=np.float64)
    if hw.measured is not None:
        eff = hw.measured.gemm_eff(m, n, k)
        speedup = np.where(fp8, hw.measured.fp8_factor, 1.0)
        copy_bps = hw.measured.copy_bps / hw.elem_scale
    else:
        eff = gemm_efficiency(hw.eff, m, n, k)
        speedup = np.where(fp8, 1.6, 1.0)
        copy_bps = hw.memory_bps * hw.eff.mem_eff
    quantize = np.where(fp8, 4.0 * (m * k + m * n) / copy_bps, 0.0)
    return 6.0 * m * n * k / (hw.peak_flops * eff) / speedup + quantize


def _layer_compute(model, hw: Hardware, fw: Profile, c, tokens, seq_len):
    """Forward+backward seconds of one layer for one micro-batch: GEMMs, attention core,
    memory-bound ops; and the forward's share of the total."""
    h, t = model.hidden, c.tp
    fp8 = c.fp8
    gemm = sum(
        _gemm_fb_s(hw, tokens, n / t if split == "out" else n, k / t if split == "in" else k, fp8)
        for n, k, split in model.attention_gemms()
    )
    qo = (model.q_width + model.o_width) / 2.0  # query-key and probability-value widths
    if model.is_moe:
        # each device holds experts/ep experts split over etp ranks; with etp < tp the
        # tokens of tp/etp sequence shards meet at each whole expert
        et = c.expert_tp
        per_expert = tokens * model.top_k * c.ep / model.experts * et / t
        local = model.experts / c.ep
        f = model.expert_ffn
        gemm = gemm + local * (
            _gemm_fb_s(hw, per_expert, f * (model.mlp_mats - 1) / et, h, fp8)
            + _gemm_fb_s(hw, per_expert, h, f / et, fp8)
        )
        if model.shared_experts:
            fs = f * model.shared_experts
            gemm = gemm + _gemm_fb_s(hw, tokens, fs * (model.mlp_mats - 1) / t, h, fp8)
            gemm = gemm + _gemm_fb_s(hw, tokens, h, fs / t, fp8)
        gemm = gemm + _gemm_fb_s(hw, tokens, model.experts, h, False)
        act_elems = tokens * model.top_k * f / t + tokens * model.shared_experts * f / t
        routing = tokens * et / t * local * fw.moe_token_expert_ns * 1e-9 * hw.elem_scale
    else:
        f = model.ffn_size
        gemm = gemm + _gemm_fb_s(hw, tokens, f * (model.mlp_mats - 1) / t, h, fp8)
        gemm = gemm + _gemm_fb_s(hw, tokens, h, f / t, fp8)
        act_elems = tokens * f / t
        routing = 0.0
    flash = c.flash
    if hw.measured is not None:
        causal_fwd = 2.0 * tokens * seq_len * qo / t
        attn_flash = 3.5 * causal_fwd / (hw.peak_flops * hw.measured.attn_eff(seq_len))
    else:
        attn_flash = 12.0 * tokens * seq_len * qo / t / (hw.peak_flops * hw.eff.attn_eff)
    # without flash attention: full score matmuls plus memory-bound passes over the scores
    score_bytes = 2.0 * tokens * seq_len * model.heads / t
    attn_plain = 12.0 * tokens * seq_len * qo / t / (hw.peak_flops * hw.eff.attn_eff) + (
        fw.score_passes * score_bytes / (hw.memory_bps * hw.eff.mem_eff)
    )
    attn = np.where(flash, attn_flash, attn_plain)
    elem = _elementwise_s(model, hw, fw, c, tokens, act_elems) + routing
    # forward share: a third of GEMMs and elementwise work, 1/3.5 of the attention core
    fwd_share = (gemm / 3.0 + attn / 3.5 + elem / 3.0) / (gemm + attn + elem)
    return gemm, attn, elem, fwd_share


def _elementwise_s(model, hw: Hardware, fw: Profile, c, tokens, act_elems) -> np.ndarray:
    """Norms, MLP activation and other passes over the hidden state, forward+backward."""
    m = hw.measured or tables_for("h100-sxm")
    assert m is not None
    scale = hw.elem_scale * np.where(c.compile, fw.elementwise_compiled, fw.elementwise_eager)
    sp_div = np.where(c.sp, c.tp, 1)
    norms = 2.0 * tokens * model.hidden / sp_div * m.rmsnorm_s_per_elem
    act_cost = m.swiglu_s_per_elem if model.gated else m.swiglu_s_per_elem * 2.0 / 3.0
    act = act_elems * act_cost
    passes = fw.extra_passes * 2.0 * tokens * model.hidden / sp_div / m.copy_bps
    return (norms + act + passes) * scale


def _head_s(model, hw: Hardware, fw: Profile, c, tokens) -> np.ndarray:
    """LM head GEMM and the loss over the vocabulary, forward+backward."""
    gemm = _gemm_fb_s(hw, tokens, model.vocab / c.tp, model.hidden, False)
    m = hw.measured or tables_for("h100-sxm")
    assert m is not None
    factor = fw.cross_entropy * np.where(c.compile, fw.elementwise_compiled, 1.0)
    loss = tokens * model.vocab / c.tp * m.ce_s_per_elem * hw.elem_scale * factor
    return gemm + loss


def _ring_bw(hw: Hardware, span, message_bytes, stride=1) -> np.ndarray:
    """Per-device bytes/s of a ring collective over `span` devices `stride` ranks apart
    (a data-parallel group's members are a TP group apart): the scale-up link when they
    all sit in one node, else the NIC; small messages reach less (half at
    `coll_half_mb`)."""
    inside = span * stride <= hw.devices_per_node
    bw = np.where(inside, hw.link_bps * hw.eff.link_eff, hw.nic_bps * hw.eff.nic_eff)
    half = hw.eff.coll_half_mb * 1e6
    return bw * message_bytes / (message_bytes + half)


def _ring_s(hw: Hardware, sc: Scales, span, volume, passes: float, stride=1, calls=1.0, a2a=False):
    """Seconds of `calls` ring collectives over `span` devices `stride` ranks apart, moving
    `passes` x (span-1)/span x `volume` per device in all (2 passes: an all-reduce).
    `a2a`: an all-to-all, which moves as much but sends to every peer at once."""
    span = np.maximum(span, 1)
    moved = passes * (span - 1) / span * volume
    bw = _ring_bw(hw, span, volume / calls, stride)
    lat = calls * _ring_latency_s(hw, span, passes, stride, a2a)
    return np.where(span > 1, (moved / bw + lat) * sc.comm, 0.0)


def _ring_latency_s(hw: Hardware, span, passes: float, stride=1, a2a=False) -> np.ndarray:
    """NCCL's latency of one ring collective (its tuning model, Simple protocol): a base,
    plus passes x (span-1) steps, those that cross to the next node at the network's
    latency and the rest at the scale-up link's. An all-to-all (grouped sends to every
    peer, no ring) waits one step."""
    nodes = np.clip(np.ceil(span * stride / hw.devices_per_node), 1, span)
    if a2a:
        steps, inter = 1.0, np.minimum(nodes - 1, 1.0)
    else:
        steps, inter = passes * (span - 1), passes * (nodes - 1)
    us = hw.eff.ring_base_us + (steps - inter) * hw.eff.link_step_us + inter * hw.eff.nic_step_us
    return us * 1e-6


def _tp_s(model, hw: Hardware, fw: Profile, sc: Scales, c, tokens):
    volume = tokens * model.hidden * (2.0 if fw.tp_comm_in_bf16 else 4.0)
    full = c.recompute_share(model.layers)
    count = 4 + 2 * full
    one = _ring_s(hw, sc, c.tp, volume, 2.0)
    gathers = fw.recompute_gathers * np.where(c.recompute == 1, 1.0, full) * one / 2.0
    return (count * one + gathers) * (1.0 - fw.overlap.tp)


def _cp_s(model, hw: Hardware, fw: Profile, sc: Scales, c, tokens, attn_fwd):
    kv_bytes = tokens * (model.k_width + model.v_width) * 2.0 / c.tp
    bw = _ring_bw(hw, c.tp * c.cp, kv_bytes)
    comm = 3.0 * (c.cp - 1) * kv_bytes / bw * sc.comm
    hidden = fw.overlap.cp * 3.5 * attn_fwd
    return np.where(c.cp > 1, np.maximum(0.0, comm - hidden), 0.0)


def _ep_s(model, hw: Hardware, fw: Profile, sc: Scales, c, tokens):
    if not model.is_moe:
        return np.zeros(len(c))
    volume = tokens * model.top_k * model.hidden * 2.0 / c.tp
    count = 4 + 2 * c.recompute_share(model.layers)
    one = _ring_s(hw, sc, c.expert_tp * c.ep, volume, 1.0, a2a=True)
    return np.where(c.ep > 1, count * one * (1.0 - fw.overlap.ep), 0.0)


def _p2p_s(model, hw: Hardware, fw: Profile, sc: Scales, c, tokens):
    volume = tokens * model.hidden * 2.0 / np.where(fw.p2p_split_by_tp, c.tp, 1)
    inner = c.tp * c.cp * c.dp
    bw = np.where(
        inner < hw.devices_per_node, hw.link_bps * hw.eff.link_eff, hw.nic_bps * hw.eff.nic_eff
    )
    one = 2.0 * c.vpp * volume / bw * sc.comm
    return np.where(c.pp > 1, one * (1.0 - fw.overlap.p2p), 0.0)


def _dp_s(model, hw: Hardware, fw: Profile, sc: Scales, c, nmb, fwd_mb, bwd_mb):
    """Exposed data-parallel seconds per step under the framework's ZeRO semantics. Routed
    experts (already split over ep) reduce and gather over their own data-parallel group:
    dp*cp*tp/(ep*etp) ranks, etp*ep apart."""
    experts = stage_expert_params(model, c)
    dense = stage_params(model, c) - experts
    d = c.dp * c.cp
    fp8_bytes = fw.fp8_param_comm_bytes or fw.param_comm_bytes
    param_bytes = np.where(c.fp8, fp8_bytes, fw.param_comm_bytes)

    def ring(volume_per_param, passes, calls):
        own = _ring_s(hw, sc, d, dense * volume_per_param, passes, stride=c.tp, calls=calls)
        if not model.is_moe:
            return own
        span, stride = d * c.tp / (c.ep * c.expert_tp), c.expert_tp * c.ep
        return own + _ring_s(hw, sc, span, experts * volume_per_param, passes, stride, calls)

    out = np.zeros(len(c))
    for z in range(4):
        stage = fw.stage(z)
        sel = c.zero == z
        if not sel.any():
            continue
        passes = 2.0 if stage.grad_op == "all_reduce" else 1.0
        calls = stage_layers(model, c) * stage.calls_per_layer  # per micro-batch
        g_calls = calls if stage.grad_reduce == "microbatch" else 1.0
        p_calls = calls if stage.param_gather == "microbatch" else 1.0
        g = ring(fw.grad_comm_bytes, passes, g_calls)
        p = ring(param_bytes, 1.0, p_calls)
        ov_g = fw.overlap.grad_reduce if stage.overlap_grad is None else stage.overlap_grad
        ov_p = fw.overlap.param_gather if stage.overlap_param is None else stage.overlap_param
        per_step = 1.0 if stage.grad_reduce == "step" else nmb
        exposed = per_step * _exposed(g, ov_g, bwd_mb, fw.overlap.interference)
        if stage.param_gather == "step":
            exposed = exposed + _exposed(p, ov_p, fwd_mb, fw.overlap.interference)
        elif stage.param_gather == "microbatch":
            window = fwd_mb + np.where(stage.gathers_per_microbatch >= 2, bwd_mb, 0.0)
            gathers = stage.gathers_per_microbatch * p
            exposed = exposed + nmb * _exposed(gathers, ov_p, window, fw.overlap.interference)
        out = np.where(sel, exposed, out)
    return np.where(d > 1, out, 0.0)


def _exposed(comm, overlap: float, window, interference: float = 0.0):
    """What compute of length `window` cannot hide of `comm`, when at most `overlap` of it
    can run concurrently; plus `interference` of the part it does hide."""
    exposed = np.maximum(comm * (1.0 - overlap), comm - window)
    return exposed + interference * (comm - exposed)


def _optimizer_s(model, hw: Hardware, fw: Profile, c):
    experts = stage_expert_params(model, c)
    held = state_params(fw, c, "optimizer", stage_params(model, c), experts)
    m = hw.measured
    bps = 28.0 / m.adamw_s_per_param_fp32 if m else hw.memory_bps * hw.eff.mem_eff
    if m and m.chip_id != hw.chip_id:
        bps = bps / hw.elem_scale
    return fw.optimizer_bytes_moved * held / bps


def costs_fields() -> tuple[str, ...]:
    """Names of the per-candidate arrays of `Costs`."""
    return tuple(f.name for f in fields(Costs))
