"""Step time, FLOPs and memory of many candidate plans on one chip group, vectorised.

Contract: `evaluate(model, hw, seq_len, cands, samples_per_replica)` returns a `Costs`
whose arrays line up with `cands`. It is pure numpy (no torch) and takes microseconds
per candidate. The model, per device and per micro-batch:

- compute: every GEMM after the TP/CP/EP split, timed at `gemm_efficiency(m, n, k)` of
  the chip; the attention core at `attn_eff`; norms, residuals and activations as
  memory-bound passes (and, without flash attention, the scores too); backward =
  `backward_factor` x 2 x forward; full recompute repeats the forward,
  selective recompute repeats the attention core;
- TP/SP collectives (2 forward, 2 backward, 2 more under full recompute) on the
  scale-up link (the NIC if TP leaves the domain); CP ring exchange of K/V hidden behind
  the attention core where it can be; EP all-to-all; PP send/recv per micro-batch;
- pipeline: (micro-batches + (pp-1)/vpp) x the slowest stage, where the last stage also
  runs the LM head and layers are shifted off it when that helps;
- DP: hierarchical reduce of gradients (scale-up link, then NIC), exposed beyond the
  backward of the last micro-batch; ZeRO-3 all-gathers parameters every micro-batch and
  hides them behind compute where it can;
- optimizer step as memory-bound traffic; a fixed step overhead; a straggler term that
  grows with the log of data-parallel replicas.

FLOP convention: `model_flops` counts matmuls and full (unmasked) attention scores,
3x forward, no recompute (for MFU); `hardware_flops` adds what recompute repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argosy.hardware.cluster import NodeGroup
from argosy.planner.efficiency import (
    ChipEfficiency,
    Constants,
    Framework,
    default_constants,
    gemm_seconds,
)
from argosy.planner.memory import GIB, Memory, memory
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Candidates


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

    @classmethod
    def of(
        cls, group: NodeGroup, constants: Constants | None = None, dtype: str = "bf16"
    ) -> Hardware:
        chip = group.chip
        constants = constants or default_constants()
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
        )


@dataclass
class Costs:
    """Arrays aligned with the candidates: seconds per step and its parts, FLOPs, memory."""

    step_s: np.ndarray
    compute_s: np.ndarray
    bubble_s: np.ndarray
    tp_s: np.ndarray
    cp_s: np.ndarray
    ep_s: np.ndarray
    pp_s: np.ndarray
    dp_s: np.ndarray
    optimizer_s: np.ndarray
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


def evaluate(
    model: ModelSpec,
    hw: Hardware,
    seq_len: int,
    c: Candidates,
    samples_per_replica,
    constants: Constants | None = None,
) -> Costs:
    """Costs of every candidate when each replica processes `samples_per_replica`."""
    fw = (constants or default_constants()).framework
    samples = np.asarray(samples_per_replica, dtype=np.float64) * np.ones(len(c))
    nmb = np.ceil(samples / c.mbs)
    tokens = c.mbs * seq_len / c.cp
    layer, head, (tp_s, cp_s, ep_s) = microbatch_times(model, hw, seq_len, c, constants)
    chunk_layers = np.ceil(model.layers / (c.pp * c.vpp))
    stage = np.maximum(chunk_layers * c.vpp * layer, (model.layers * layer + head) / c.pp)
    pp_s = _p2p_s(model, hw, fw, c, tokens)
    per_mb = stage + pp_s
    bubble = (c.pp - 1) / c.vpp * per_mb
    pipe = nmb * per_mb + bubble
    dp_s = _dp_s(model, hw, fw, c, nmb, stage, pipe)
    opt = _optimizer_s(model, hw, c)
    jitter = 1.0 + fw.straggler_per_doubling * np.log2(c.dp * c.cp)
    step = (pipe + dp_s + opt + fw.step_overhead_s) * jitter
    flops_tok = model.forward_flops_per_token(seq_len)
    total_tokens = samples * c.dp * seq_len
    model_flops = 3.0 * flops_tok * total_tokens
    extra = np.select(
        [c.recompute == 2, c.recompute == 1],
        [flops_tok - 2.0 * model.vocab * model.hidden, 4.0 * seq_len * model.hidden * model.layers],
        0.0,
    )
    mem = memory(model, c, seq_len, nmb, fw.reserved_gib)
    return Costs(
        step_s=step,
        compute_s=nmb * stage,
        bubble_s=bubble,
        tp_s=nmb * tp_s * chunk_layers * c.vpp,
        cp_s=nmb * cp_s * chunk_layers * c.vpp,
        ep_s=nmb * ep_s * chunk_layers * c.vpp,
        pp_s=nmb * pp_s,
        dp_s=dp_s,
        optimizer_s=opt,
        model_flops=model_flops,
        hardware_flops=model_flops + extra * total_tokens,
        memory=mem,
        capacity_gib=hw.memory_gib,
    )


def microbatch_times(model: ModelSpec, hw: Hardware, seq_len: int, c: Candidates, constants=None):
    """Seconds of one layer (forward, backward, recompute, TP/CP/EP traffic) and of the
    LM head for one micro-batch on one device; also the TP, CP and EP parts of a layer."""
    fw = (constants or default_constants()).framework
    tokens = c.mbs * seq_len / c.cp
    fwd, attn_core = _layer_forward_s(model, hw, fw, c, tokens, seq_len)
    rec_extra = np.select([c.recompute == 2, c.recompute == 1], [fwd, attn_core], 0.0)
    tp_s = _tp_s(model, hw, fw, c, tokens)
    cp_s = _cp_s(model, hw, c, tokens, attn_core)
    ep_s = _ep_s(model, hw, fw, c, tokens)
    layer = (1.0 + 2.0 * fw.backward_factor) * fwd + rec_extra + tp_s + cp_s + ep_s
    head = 3.0 * gemm_seconds(hw.eff, hw.peak_flops, tokens, model.vocab / c.tp, model.hidden)
    return layer, head, (tp_s, cp_s, ep_s)


def _layer_forward_s(model, hw, fw: Framework, c, tokens, seq_len):
    """Forward seconds of one layer for one micro-batch, and of its attention core."""
    h, t = model.hidden, c.tp
    qkv = h + 2 * model.kv * model.head_dim
    g = hw.eff
    gemm = gemm_seconds(g, hw.peak_flops, tokens, qkv / t, h) + gemm_seconds(
        g, hw.peak_flops, tokens, h, h / t
    )
    if model.is_moe:
        per_expert = tokens * model.top_k * c.ep / model.experts
        local = model.experts / c.ep
        f = model.expert_ffn
        up = gemm_seconds(g, hw.peak_flops, per_expert, f * (model.mlp_mats - 1) / t, h)
        down = gemm_seconds(g, hw.peak_flops, per_expert, h, f / t)
        gemm = gemm + local * (up + down)
        if model.shared_experts:
            fs = f * model.shared_experts
            gemm = gemm + gemm_seconds(g, hw.peak_flops, tokens, fs * (model.mlp_mats - 1) / t, h)
            gemm = gemm + gemm_seconds(g, hw.peak_flops, tokens, h, fs / t)
        gemm = gemm + gemm_seconds(g, hw.peak_flops, tokens, model.experts, h)
    else:
        f = model.ffn_size
        gemm = gemm + gemm_seconds(g, hw.peak_flops, tokens, f * (model.mlp_mats - 1) / t, h)
        gemm = gemm + gemm_seconds(g, hw.peak_flops, tokens, h, f / t)
    attn = 4.0 * tokens * seq_len * h / t / (hw.peak_flops * g.attn_eff)
    elem_div = np.where(c.sp, t, 1)
    elem = fw.elementwise_passes * 2.0 * tokens * h / elem_div / (hw.memory_bps * g.mem_eff)
    # without flash attention the scores make memory-bound passes over (s x s) per head
    scores = (
        fw.score_passes * 2.0 * tokens * seq_len * model.heads / t / (hw.memory_bps * g.mem_eff)
    )
    attn = attn + np.where(c.flash, 0.0, scores)
    return gemm + attn + elem, attn


def _bw(hw: Hardware, group_span, per_node_ok) -> np.ndarray:
    """Per-direction bytes/s for a collective: scale-up link inside the domain, else NIC."""
    return np.where(
        per_node_ok & (group_span <= hw.domain_size),
        hw.link_bps * hw.eff.link_eff,
        hw.nic_bps * hw.eff.nic_eff,
    )


def _tp_s(model, hw, fw: Framework, c, tokens):
    volume = tokens * model.hidden * 2.0
    count = 4 + np.where(c.recompute == 2, 2, 0)
    bw = _bw(hw, c.tp, True)
    one = 2.0 * (c.tp - 1) / c.tp * volume / bw + fw.collective_latency_us * 1e-6 * np.log2(
        np.maximum(c.tp, 1)
    )
    return np.where(c.tp > 1, count * one * fw.tp_exposed, 0.0)


def _cp_s(model, hw, c, tokens, attn_core):
    kv_bytes = 2.0 * tokens * model.kv * model.head_dim * 2.0 / c.tp
    comm = 3.0 * (c.cp - 1) * kv_bytes / _bw(hw, c.tp * c.cp, True)
    return np.where(c.cp > 1, np.maximum(0.0, comm - 3.0 * attn_core), 0.0)


def _ep_s(model, hw, fw: Framework, c, tokens):
    if not model.is_moe:
        return np.zeros(len(c))
    volume = tokens * model.top_k * model.hidden * 2.0 * (c.ep - 1) / c.ep / c.tp
    count = 4 + np.where(c.recompute == 2, 2, 0)
    return np.where(c.ep > 1, count * volume / _bw(hw, c.tp * c.ep, True) * fw.a2a_exposed, 0.0)


def _p2p_s(model, hw, fw: Framework, c, tokens):
    volume = tokens * model.hidden * 2.0 / c.tp
    inner = c.tp * c.cp * c.dp
    bw = np.where(
        inner < hw.devices_per_node, hw.link_bps * hw.eff.link_eff, hw.nic_bps * hw.eff.nic_eff
    )
    return np.where(c.pp > 1, 2.0 * c.vpp * volume / bw * fw.p2p_exposed, 0.0)


def _dp_s(model, hw, fw: Framework, c, nmb, stage, pipe):
    """Exposed data-parallel seconds per step (gradient reduction; ZeRO-3 gathers)."""
    from argosy.planner.memory import layer_params_per_device

    params = np.ceil(model.layers / c.pp) * layer_params_per_device(
        model, c
    ) + 2 * model.vocab * model.hidden / c.tp / np.minimum(c.pp, 2)
    d = c.dp * c.cp
    d_in = np.clip(hw.devices_per_node // (c.tp * c.cp), 1, None)
    d_in = np.minimum(d, np.where(c.dp >= d_in, d_in, c.dp))
    d_out = np.maximum(d / d_in, 1)
    grad = params * fw.grad_bytes
    lat = fw.collective_latency_us * 1e-6 * 2.0 * np.log2(np.maximum(d, 1))
    link, nic = hw.link_bps * hw.eff.link_eff, hw.nic_bps * hw.eff.nic_eff
    allreduce = (
        2.0 * (d_in - 1) / d_in * grad / link + 2.0 * (d_out - 1) / d_out * grad / d_in / nic + lat
    )
    hidden_window = fw.dp_overlap * stage * 2.0 / 3.0
    plain = np.maximum(0.0, allreduce - hidden_window)
    # ZeRO-2 reduce-scatters gradients every micro-batch, behind that micro-batch's backward
    zero2 = np.maximum(0.0, nmb * allreduce / 2.0 - nmb * hidden_window) + allreduce / 2.0
    plain = np.where(c.zero == 2, np.maximum(plain, zero2), plain)
    # ZeRO-3 gathers and scatters run per layer on the flat data-parallel group
    gathers = 2 + np.where(c.recompute == 2, 1, 0)
    one_pass = (d - 1) / d * params * 2.0 / np.where(d_out > 1, nic, link) + lat
    zero3_comm = nmb * (gathers + 1) * one_pass
    zero3 = np.maximum(0.0, zero3_comm - pipe)
    return np.where(d > 1, np.where(c.zero >= 3, zero3, plain), 0.0)


def _optimizer_s(model, hw, c):
    from argosy.planner.memory import layer_params_per_device

    params = np.ceil(model.layers / c.pp) * layer_params_per_device(model, c)
    shard = np.where(c.zero >= 1, c.dp * c.cp, 1)
    return 36.0 * params / shard / (hw.memory_bps * hw.eff.mem_eff)
