"""Emit a plan as what a user pastes into a framework: Megatron-LM arguments,
a torchtitan TOML section, or a DeepSpeed JSON config (with the Megatron-DeepSpeed
arguments for TP, PP and experts under `megatron_deepspeed_args`, a key DeepSpeed does not
read). One function per framework, registered by name; the flags are checked against each
framework's documented arguments in tests/planner/golden/:

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
    """Megatron-LM `pretrain_gpt.py` arguments (flags of megatron/training/arguments.py)."""
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
        "--untie-embeddings-and-output-weights",  # argosy's models have an untied LM head
    ]
    args += _megatron_architecture(model)
    if model.is_moe:
        args += [f"--num-experts {model.experts}", f"--moe-router-topk {model.top_k}"]
        args.append(f"--expert-model-parallel-size {p.ep}")
        if model.moe_ffn:
            args.append(f"--moe-ffn-hidden-size {model.moe_ffn}")
        if model.shared_experts:
            args.append(
                f"--moe-shared-expert-intermediate-size {model.shared_experts * model.expert_ffn}"
            )
    if p.vpp > 1:
        args.append(
            f"--num-layers-per-virtual-pipeline-stage {max(1, model.layers // (p.pp * p.vpp))}"
        )
    if p.sp and p.tp > 1:
        args.append("--sequence-parallel")
    args += _megatron_memory(p)
    if p.flash:
        args.append("--attention-backend flash")
    if p.fp8:
        args.append("--fp8-format hybrid")
    return " \\\n  ".join(args)


def _megatron_architecture(model: ModelSpec) -> list[str]:
    """Llama-family shape flags: RMSNorm, rotary embeddings, SwiGLU, no biases, GQA."""
    args = []
    if model.gated:
        args += [
            "--normalization RMSNorm",
            "--position-embedding-type rope",
            "--swiglu",
            "--disable-bias-linear",
        ]
    if model.kv != model.heads:
        args += ["--group-query-attention", f"--num-query-groups {model.kv}"]
    return args


def _megatron_memory(p: Parallel) -> list[str]:
    """Recompute and ZeRO: zero=1 and zero=2 are the distributed optimizer (states sharded,
    gradients reduce-scattered and parameters gathered once per step, overlapped);
    zero=3 is Megatron-FSDP."""
    args = []
    if p.recompute == "selective":
        args.append("--recompute-activations")
    elif p.recompute == "full":
        args += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    if p.zero in (1, 2):
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    elif p.zero == 3:  # Megatron-FSDP (older releases: --use-custom-fsdp)
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params"]
        args += ["--no-gradient-accumulation-fusion", "--overlap-grad-reduce"]
    else:
        args.append("--overlap-grad-reduce")
    return args


def torchtitan(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """torchtitan job TOML ([training], [parallelism], [activation_checkpoint], and
    [model]/[float8] for fp8): fields of torchtitan/config/job_config.py."""
    sharded = p.zero >= 2
    shard = p.dp if sharded else 1
    replicate = p.dp // shard
    lines = [
        "[training]",
        # with PP the local batch is split into micro-batches; without, extra local
        # batches become gradient accumulation (global / (dp * local) steps)
        f"local_batch_size = {global_batch // p.dp if p.pp > 1 else p.mbs}",
        f"global_batch_size = {global_batch}",
        f"seq_len = {seq_len}",
        'mixed_precision_param = "bfloat16"',
        f"compile = {str(p.compile).lower()}",
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
    ]
    if sharded:  # zero=2: gather once per micro-batch; zero=3: again for the backward
        lines.append(f'fsdp_reshard_after_forward = "{"never" if p.zero == 2 else "always"}"')
    if p.tp > 1 and p.compile:
        lines.append("enable_async_tensor_parallel = true")
    lines += ["", "[activation_checkpoint]", f'mode = "{p.recompute}"']
    if p.recompute == "selective":
        lines.append('selective_ac_option = "op"')
    if p.fp8:
        lines += ["", "[model]", 'converters = ["float8"]', "", "[float8]"]
        lines.append(f"enable_fsdp_float8_all_gather = {str(sharded).lower()}")
    return "\n".join(lines)


def deepspeed(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """DeepSpeed config JSON (documented keys of deepspeed.ai/docs/config-json), and the
    Megatron-DeepSpeed launcher arguments that carry TP, PP and expert parallelism."""
    config: dict[str, object] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": p.mbs,
        "gradient_accumulation_steps": global_batch // (p.dp * p.mbs),
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": p.zero, "overlap_comm": True, "contiguous_gradients": True},
        "activation_checkpointing": {"partition_activations": p.recompute != "none"},
    }
    args = [
        f"--tensor-model-parallel-size {p.tp}",
        f"--pipeline-model-parallel-size {p.pp}",
        f"--micro-batch-size {p.mbs}",
        f"--global-batch-size {global_batch}",
        f"--seq-length {seq_len}",
    ]
    if p.sp and p.tp > 1 and p.cp == 1:  # Megatron SP and DeepSpeed's Ulysses exclude each other
        args.append("--sequence-parallel")
    if p.recompute == "selective":
        args.append("--recompute-activations")
    elif p.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform"]
    if model.is_moe:
        args += [f"--num-experts {model.experts}", f"--moe-expert-parallel-size {p.ep}"]
        args.append(f"--topk {model.top_k}")
    if p.cp > 1:
        args.append(f"--ds-sequence-parallel-size {p.cp}")
    config["megatron_deepspeed_args"] = args
    return json.dumps(config, indent=2)


emitters.register("megatron", megatron, aliases=("megatron-lm", "nemo"))
emitters.register("torchtitan", torchtitan, aliases=("titan",))
emitters.register("deepspeed", deepspeed, aliases=("ds",))
