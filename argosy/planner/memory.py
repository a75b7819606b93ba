"""Memory per device of many candidate plans at once (bytes, numpy arrays).

Terms, for the worse of the first and the last pipeline stage:

- weights, gradients and optimizer states per parameter held (Megatron: 2 + 4 + 12 B),
  sharded over data parallel as the framework's ZeRO stage says; the embedding lives on
  the first stage and the LM head on the last; gradients a framework allocates lazily
  are not yet there at the loss of a one-device, one-micro-batch step;
- activations per layer and micro-batch after Korthikanti et al. 2022 (34 s b h + 5 a s^2 b
  bytes, the parallel part divided by TP, the rest by TP only with sequence parallelism;
  flash attention never stores the attention scores and selective recompute drops
  them, full recompute keeps only the layer input, of the recomputed layers under the
  block method), times the micro-batches in flight
  on the first stage of a 1F1B or interleaved pipeline; fp32 logits and their
  gradient on the last stage;
- the allocator's reserve (a fraction of the allocated peak) plus the runtime's own
  memory (CUDA context, communicator buffers).

Bytes per parameter, what each ZeRO stage shards and the activation accounting come
from the framework profile (`frameworks.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Candidates

GIB = 1024.0**3


@dataclass
class Memory:
    """Bytes per device of each term (arrays), on the fuller of first and last stage."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    logits: np.ndarray
    reserved: np.ndarray

    @property
    def allocated(self) -> np.ndarray:
        """What the framework allocates at its peak (torch.cuda.max_memory_allocated)."""
        return self.total - self.reserved

    @property
    def total(self) -> np.ndarray:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.logits
            + self.reserved
        )

    def terms(self, i: int) -> dict[str, float]:
        """GiB per term for candidate `i`."""
        names = ("weights", "gradients", "optimizer", "activations", "logits", "reserved")
        return {name: float(getattr(self, name)[i]) / GIB for name in names}


def layer_params_per_device(model: ModelSpec, c: Candidates) -> np.ndarray:
    """Parameters of one transformer layer held by one device."""
    attn = model.attn_params() / c.tp
    if not model.is_moe:
        return attn + model.mlp_params() / c.tp + 2 * model.hidden
    one = model.mlp_mats * model.hidden * model.expert_ffn
    shared = one * model.shared_experts / c.tp
    experts = layer_expert_params_per_device(model, c)
    return attn + experts + shared + model.hidden * model.experts + 2 * model.hidden


def layer_expert_params_per_device(model: ModelSpec, c: Candidates) -> np.ndarray:
    """Routed-expert parameters of one layer held by one device (0 for a dense model)."""
    if not model.is_moe:
        return np.zeros(len(c))
    split = c.ep * c.expert_tp
    return model.mlp_mats * model.hidden * model.expert_ffn * model.experts / split


def activation_bytes_per_layer(
    model: ModelSpec,
    c: Candidates,
    seq_len: int,
    accounting: str = "megatron",
    selective_kept: float = 1.0,
    fp8_kept: float = 0.75,
) -> np.ndarray:
    """Activation bytes one layer keeps for one micro-batch on one device.

    `megatron`: Korthikanti et al. 2022 with fused kernels (34 s b h + 5 a s^2 b for GPT;
    the MLP term grows with the FFN width and gating). `eager`: what PyTorch autograd saves
    for an unfused Llama block: two RMSNorms that upcast to fp32 (6h each), q, k, v,
    the attention output and its contiguous copy, and the MLP's gate, activation, up and
    product (8 f; 4 f without gating). `hf`: the same block as Hugging Face's Llama runs
    it, counted at the dispatcher (benchmarks/planner_memory_single.py): each RMSNorm
    keeps its fp32 upcast, its bf16 normalised copy and its weighted output (the next
    GEMMs' input; 8h each), attention keeps the rotated q and k, v, its output (already
    laid out for the output projection: no copy) and an fp32 log-sum-exp per head."""
    h, q, o = model.hidden, model.q_width, model.o_width
    tokens = c.mbs * seq_len / c.cp
    kv = model.k_width + model.v_width
    latent = 2.0 * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_dim)
    f_eff = (
        model.ffn_size
        if not model.is_moe
        else model.expert_ffn * (model.top_k + model.shared_experts)
    )
    sp_div = np.where(c.sp, c.tp, 1)
    mlp = (8.0 if model.gated else 4.0) * f_eff
    if accounting == "eager":
        nonpar = 12.0 * h
        par = 2.0 * q + 4.0 * o + 2.0 * kv + latent + mlp
        per_token = nonpar / sp_div + par / c.tp
    elif accounting == "hf":
        nonpar = 16.0 * h
        par = 2.0 * q + 2.0 * o + 2.0 * kv + latent + 4.0 * model.heads + mlp
        per_token = nonpar / sp_div + par / c.tp
    else:
        f_eff = f_eff * (1.5 if model.gated else 1.0)
        attn = (3 * h + 2 * q + 2 * o + 2 * kv + latent) / h  # input, mask; q, context; k, v
        mlp = 3 + 4 * f_eff / h
        total = 4 + attn + mlp
        nonpar_h, par_h = 10.0, total - 10.0
        per_token = h * (nonpar_h / sp_div + par_h / c.tp)
    # fp8 GEMMs that keep their inputs in fp8 (Transformer Engine) save about a quarter
    per_token = per_token * np.where(c.fp8, fp8_kept, 1.0)
    per_token = per_token * np.where(c.recompute == 1, selective_kept, 1.0)
    scores = 5.0 * model.heads * tokens * (seq_len / c.cp) / c.tp
    kept = tokens * per_token + np.where((c.recompute == 0) & ~c.flash, scores, 0.0)
    full = c.recompute_share(model.layers)  # block method: the rest keep everything
    whole = tokens * per_token + np.where(~c.flash, scores, 0.0)
    return np.where(c.recompute == 2, full * 2.0 * tokens * h / sp_div + (1 - full) * whole, kept)


def _sharded(profile, c: Candidates, state: str) -> np.ndarray:
    """Divisor of a state held per device: dp*cp where the candidate's ZeRO stage shards it."""
    out = np.ones(len(c))
    for z in range(4):
        if state in profile.stage(z).shard:
            out = np.where(c.zero == z, c.dp * c.cp, out)
    return out


def state_params(profile, c: Candidates, state: str, params, experts) -> np.ndarray:
    """Parameters whose `state` one device holds: the dense ones sharded over dp*cp, the
    routed experts (already split over ep x etp) only over their own data-parallel group,
    dp*cp*tp/(ep*etp) ranks (Megatron's expert data parallel)."""
    div = _sharded(profile, c, state)
    expert_div = np.where(div > 1, div * c.tp / (c.ep * c.expert_tp), 1.0)
    return (params - experts) / div + experts / expert_div


def stage_layers(model: ModelSpec, c: Candidates) -> np.ndarray:
    """Layers of the fullest pipeline stage."""
    return np.ceil(model.layers / c.pp)


def stage_expert_params(model: ModelSpec, c: Candidates) -> np.ndarray:
    """Routed-expert parameters held by one device of the fullest stage."""
    return stage_layers(model, c) * layer_expert_params_per_device(model, c)


def stage_params(model: ModelSpec, c: Candidates) -> np.ndarray:
    """Parameters held by one device of the fullest stage (layers and embedding or head)."""
    ends = model.vocab * model.hidden / c.tp
    body = stage_layers(model, c) * layer_params_per_device(model, c)
    return body + np.where(c.pp == 1, 2 * ends, ends)


def memory(model: ModelSpec, c: Candidates, seq_len: int, nmb: np.ndarray, profile) -> Memory:
    """Per-device memory of every candidate under a framework `profile`, the fuller of
    first and last stage; the reserve is the allocator's fraction plus the runtime."""
    mem = profile.memory
    layers_stage = stage_layers(model, c)
    per_layer = layer_params_per_device(model, c)
    params = stage_params(model, c)
    experts = stage_expert_params(model, c)
    weight_div = _sharded(profile, c, "weights")
    # sharded weights are gathered (bf16) a layer at a time, the next one prefetched
    gathered = np.where(weight_div > 1, 2.0 * 2.0 * per_layer, 0.0)
    weights = mem.weight_bytes * state_params(profile, c, "weights", params, experts) + gathered
    grads = mem.grad_bytes * state_params(profile, c, "grads", params, experts)
    optim = mem.optimizer_bytes * state_params(profile, c, "optimizer", params, experts)
    inflight = np.minimum(c.pp, nmb) * np.where(c.vpp > 1, 1 + (c.pp - 1) / (c.pp * c.vpp), 1.0)
    act_layer = activation_bytes_per_layer(
        model, c, seq_len, mem.activations, profile.selective.kept, mem.fp8_activations
    )
    act_layer = act_layer * np.where(c.compile, mem.compiled_activations, 1.0)
    tokens = c.mbs * seq_len / c.cp
    # outside the layers: the final RMSNorm's saved copies and output under `hf` (8h)
    edge = 8.0 if mem.activations == "hf" else 2.0
    acts = (layers_stage * act_layer + edge * tokens * model.hidden) * inflight
    compiled_logits = mem.compiled_logits_bytes_per_vocab or mem.logits_bytes_per_vocab
    per_vocab = np.where(c.compile, compiled_logits, mem.logits_bytes_per_vocab)
    logits = per_vocab * tokens * model.vocab / c.tp
    # first stage carries the in-flight activations, the last the logits: take the worse
    last = np.where(c.pp == 1, acts, layers_stage * act_layer) + logits
    worse_is_last = last > acts
    acts_out = np.where(worse_is_last, last - logits, acts)
    logits_out = np.where(worse_is_last | (c.pp == 1), logits, 0.0)
    if mem.lazy_grads:
        # one device, one micro-batch: the loss peaks before the backward allocates the
        # gradients, the optimizer step after; the gradient term is what the step adds
        alone = (c.tp * c.pp * c.dp * c.cp == 1) & (nmb == 1)
        grads = np.where(alone, np.maximum(grads - acts_out - logits_out, 0.0), grads)
    allocated = weights + grads + optim + acts_out + logits_out
    reserved = allocated * mem.reserve_fraction + mem.runtime_gib * GIB
    return Memory(weights, grads, optim, acts_out, logits_out, reserved)
