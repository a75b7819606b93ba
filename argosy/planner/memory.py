"""Memory per device of many candidate plans at once (bytes, numpy arrays).

Terms, for the worse of the first and the last pipeline stage:

- weights (bf16, 2 B), gradients (fp32 main grads, 4 B), optimizer (fp32 master, m, v:
  12 B) per parameter held, sharded over data parallel by ZeRO 1 (optimizer), 2 (+ grads),
  3 (+ weights); the embedding lives on the first stage and the LM head on the last;
- activations per layer and micro-batch after Korthikanti et al. 2022 (34 s b h + 5 a s^2 b
  bytes, the parallel part divided by TP, the rest by TP only with sequence parallelism;
  flash attention never stores the attention scores and selective recompute drops
  them, full recompute keeps only the layer input), times the micro-batches in flight
  on the first stage of a 1F1B or interleaved pipeline; fp32 logits and their
  gradient on the last stage;
- a fixed reserve for the runtime, workspace and fragmentation.
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
    experts = one * model.experts / (c.ep * c.tp)
    shared = one * model.shared_experts / c.tp
    return attn + experts + shared + model.hidden * model.experts + 2 * model.hidden


def activation_bytes_per_layer(model: ModelSpec, c: Candidates, seq_len: int) -> np.ndarray:
    """Activation bytes one layer keeps for one micro-batch on one device."""
    h = model.hidden
    tokens = c.mbs * seq_len / c.cp
    f_eff = (
        model.ffn_size
        if not model.is_moe
        else model.expert_ffn * (model.top_k + model.shared_experts)
    )
    f_eff = f_eff * (1.5 if model.gated else 1.0)
    attn = 5 + 2 * (h + 2 * model.kv * model.head_dim) / h
    mlp = 3 + 4 * f_eff / h
    total = 4 + attn + mlp
    nonpar, par = 10.0, total - 10.0
    sp_div = np.where(c.sp, c.tp, 1)
    per_token = h * (nonpar / sp_div + par / c.tp)
    scores = 5.0 * model.heads * tokens * (seq_len / c.cp) / c.tp
    kept = tokens * per_token + np.where((c.recompute == 0) & ~c.flash, scores, 0.0)
    return np.where(c.recompute == 2, 2.0 * tokens * h / sp_div, kept)


def memory(
    model: ModelSpec, c: Candidates, seq_len: int, nmb: np.ndarray, reserved_gib: float
) -> Memory:
    """Per-device memory of every candidate, the fuller of first and last stage."""
    layers_stage = np.ceil(model.layers / c.pp)
    body = layers_stage * layer_params_per_device(model, c)
    ends = model.vocab * model.hidden / c.tp
    params = body + np.where(c.pp == 1, 2 * ends, ends)
    dcp = c.dp * c.cp
    weights = 2.0 * params / np.where(c.zero >= 3, dcp, 1)
    grads = 4.0 * params / np.where(c.zero >= 2, dcp, 1)
    optim = 12.0 * params / np.where(c.zero >= 1, dcp, 1)
    inflight = np.minimum(c.pp, nmb) * np.where(c.vpp > 1, 1 + (c.pp - 1) / (c.pp * c.vpp), 1.0)
    acts = layers_stage * activation_bytes_per_layer(model, c, seq_len) * inflight
    tokens = c.mbs * seq_len / c.cp
    acts = acts + 2.0 * tokens * model.hidden * inflight  # embedding output / stage input
    logits = 8.0 * tokens * model.vocab / c.tp
    # first stage carries the in-flight activations, the last the logits: take the worse
    first = acts
    last = (
        np.where(c.pp == 1, acts, layers_stage * activation_bytes_per_layer(model, c, seq_len))
        + logits
    )
    worse_is_last = last > first
    acts_out = np.where(worse_is_last, last - logits, first)
    logits_out = np.where(worse_is_last | (c.pp == 1), logits, 0.0)
    reserved = np.full(len(c), reserved_gib * GIB)
    return Memory(weights, grads, optim, acts_out, logits_out, reserved)
