"""Emit a plan as what a user pastes into a framework: Megatron-LM arguments,
a torchtitan TOML section, or a DeepSpeed JSON config. One function per framework,
registered by name:

    emitters.get("megatron")(parallel, model, seq_len=4096, global_batch=512)
"""

from __future__ import annotations

import json
from collections.abc import Callable

from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Parallel
from argosy.plugins.registry import Registry

Emitter = Callable[..., str]
emitters: Registry[Emitter] = Registry("emitter")


def megatron(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """Megatron-LM `pretrain_gpt.py` arguments."""
    args = [
        f"--num-layers {model.layers}",
        f"--hidden-size {model.hidden}",
        f"--num-attention-heads {model.heads}",
        f"--ffn-hidden-size {model.ffn_size}",
        f"--seq-length {seq_len}",
        f"--max-position-embeddings {seq_len}",
        f"--micro-batch-size {p.mbs}",
        f"--global-batch-size {global_batch}",
        f"--tensor-model-parallel-size {p.tp}",
        f"--pipeline-model-parallel-size {p.pp}",
        f"--context-parallel-size {p.cp}",
        "--bf16",
    ]
    if model.kv != model.heads:
        args += ["--group-query-attention", f"--num-query-groups {model.kv}"]
    if model.gated:
        args.append("--swiglu")
    if model.is_moe:
        args += [f"--num-experts {model.experts}", f"--moe-router-topk {model.top_k}"]
        args.append(f"--expert-model-parallel-size {p.ep}")
    if p.vpp > 1:
        args.append(
            f"--num-layers-per-virtual-pipeline-stage {max(1, model.layers // (p.pp * p.vpp))}"
        )
    if p.sp and p.tp > 1:
        args.append("--sequence-parallel")
    if p.recompute == "selective":
        args.append("--recompute-activations")
    elif p.recompute == "full":
        args += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    if p.zero >= 1:
        args.append("--use-distributed-optimizer")
    if p.zero >= 2:  # Megatron-FSDP (older releases: --use-custom-fsdp)
        strategy = "optim_grads" if p.zero == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}"]
        args.append("--no-gradient-accumulation-fusion")
    if p.flash:
        args.append("--use-flash-attn")
    args += (
        ["--overlap-grad-reduce", "--overlap-param-gather"]
        if p.zero >= 1
        else ["--overlap-grad-reduce"]
    )
    return " \\\n  ".join(args)


def torchtitan(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """torchtitan job TOML sections ([training], [parallelism], [activation_checkpoint])."""
    shard = p.dp if p.zero >= 2 else 1
    replicate = p.dp // shard
    mode = {"none": "none", "selective": "selective", "full": "full"}[p.recompute]
    lines = [
        "[training]",
        # with PP the local batch is split into micro-batches; without, extra local
        # batches become gradient accumulation (global / (dp * local) steps)
        f"local_batch_size = {global_batch // p.dp if p.pp > 1 else p.mbs}",
        f"global_batch_size = {global_batch}",
        f"seq_len = {seq_len}",
        'mixed_precision_param = "bfloat16"',
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {p.tp}",
        f"pipeline_parallel_degree = {p.pp}",
        f"context_parallel_degree = {p.cp}",
        f"expert_parallel_degree = {p.ep}",
        f"pipeline_parallel_microbatch_size = {p.mbs}",
        f'pipeline_parallel_schedule = "{"Interleaved1F1B" if p.vpp > 1 else "1F1B"}"',
        "",
        "[activation_checkpoint]",
        f'mode = "{mode}"',
    ]
    return "\n".join(lines)


def deepspeed(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """DeepSpeed config JSON (ZeRO stage, batch sizes, bf16); TP/PP go to Megatron-DeepSpeed."""
    config = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": p.mbs,
        "gradient_accumulation_steps": global_batch // (p.dp * p.mbs),
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": p.zero, "overlap_comm": True, "contiguous_gradients": True},
        "activation_checkpointing": {"partition_activations": p.recompute != "none"},
        "pipeline": {"stages": p.pp},
        "tensor_parallel": {"autotp_size": p.tp},
        "sequence_parallel_size": p.cp,
    }
    return json.dumps(config, indent=2)


emitters.register("megatron", megatron, aliases=("megatron-lm", "nemo"))
emitters.register("torchtitan", torchtitan, aliases=("titan",))
emitters.register("deepspeed", deepspeed, aliases=("ds",))
