"""DeepSpeed 0.19 config JSON with the Megatron-DeepSpeed arguments for a plan, and their
read-back.

Contract: `deepspeed(plan, model, seq_len=, global_batch=)` returns the DeepSpeed config
(documented keys of deepspeed.ai/docs/config-json) with, under `megatron_deepspeed_args`
(a key DeepSpeed does not read), the Megatron-DeepSpeed `pretrain_gpt.py` arguments: the
model shape, `--bf16` (so parameters are bf16 as the JSON says), TP and PP
(`--no-pipeline-parallel` when pp=1, which ZeRO-2/3 need), `--zero-stage` equal to the
JSON's, Ulysses CP as `--ds-sequence-parallel-size`, and for MoE models every layer an
MoE layer (`--expert-interval 1`). Layouts DeepSpeed cannot run (ZeRO-2/3 or CP with PP,
VPP) raise `EmitRefusedError` (`argosy.planner.support`). `read_deepspeed(text, devices)`
parses both parts back into `Semantics`.
"""

from __future__ import annotations

import json

from argosy.planner.emit_megatron import flags
from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Parallel
from argosy.planner.readback import EmitRefusedError, Semantics
from argosy.planner.support import refusal

FRAMEWORK = "deepspeed"
CONFIG_FILE = "ds_config.json"


def deepspeed(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """DeepSpeed config JSON and the Megatron-DeepSpeed launcher arguments."""
    why = refusal(FRAMEWORK, p, model, global_batch)
    if why:
        raise EmitRefusedError(why)
    if model.is_mla:
        raise EmitRefusedError(
            f"Megatron-DeepSpeed has no multi-head latent attention ({model.name}: "
            f"kv_lora_rank {model.kv_lora_rank}); it would train plain attention instead"
        )
    config: dict[str, object] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": p.mbs,
        "gradient_accumulation_steps": global_batch // (p.dp * p.mbs),
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": p.zero, "overlap_comm": True, "contiguous_gradients": True},
        "activation_checkpointing": {"partition_activations": p.recompute != "none"},
    }
    config["megatron_deepspeed_args"] = _shape(model, seq_len) + _layout(p, global_batch)
    config["megatron_deepspeed_args"] += _moe(p, model) + _memory(p)
    return json.dumps(config, indent=2)


def _shape(model: ModelSpec, seq_len: int) -> list[str]:
    args = [
        f"--num-layers {model.layers}",
        f"--hidden-size {model.hidden}",
        f"--ffn-hidden-size {model.ffn_size}",
        f"--num-attention-heads {model.heads}",
        f"--num-key-value-heads {model.kv}",
        f"--seq-length {seq_len}",
        f"--max-position-embeddings {seq_len}",
        "--untie-embeddings-and-output-weights",
        "--bf16",
    ]
    if model.heads * model.head_dim != model.hidden:
        args.append(f"--kv-channels {model.head_dim}")
    if model.gated:
        args += [
            "--normalization rmsnorm",
            "--use-rotary-position-embeddings",
            "--swiglu",
            "--disable-bias-linear",
        ]
    return args


def _layout(p: Parallel, global_batch: int) -> list[str]:
    args = [
        f"--tensor-model-parallel-size {p.tp}",
        f"--pipeline-model-parallel-size {p.pp}",
        f"--micro-batch-size {p.mbs}",
        f"--global-batch-size {global_batch}",
        "--deepspeed",
        f"--deepspeed_config {CONFIG_FILE}",
        f"--zero-stage {p.zero}",
    ]
    if p.pp == 1:
        args.append("--no-pipeline-parallel")
    if p.sp and p.tp > 1 and p.cp == 1:  # Megatron SP and DeepSpeed's Ulysses exclude each other
        args.append("--sequence-parallel")
    if p.cp > 1:
        args.append(f"--ds-sequence-parallel-size {p.cp}")
    if p.flash:
        args.append("--use-flash-attn-v2")
    return args


def _moe(p: Parallel, model: ModelSpec) -> list[str]:
    if not model.is_moe:
        return []
    args = [
        f"--num-experts {model.experts}",
        "--expert-interval 1",  # the default 2 makes only every second layer MoE
        f"--topk {model.top_k}",
        f"--moe-expert-parallel-size {p.ep}",
    ]
    if p.tp > 1 and p.expert_tp == p.tp:  # experts are whole on each device by default
        args.append("--enable-expert-tensor-parallelism")
    return args


def _memory(p: Parallel) -> list[str]:
    if p.recompute == "selective":
        return ["--recompute-activations"]
    if p.partial_recompute:  # Megatron-DeepSpeed's block method: first k layers per stage
        k = p.recompute_layers
        return [
            "--recompute-granularity full",
            "--recompute-method block",
            f"--recompute-num-layers {k}",
        ]
    if p.recompute == "full":
        return ["--recompute-granularity full", "--recompute-method uniform"]
    return []


def read_deepspeed(text: str, devices: int) -> Semantics:
    """The plan semantics of the config and its arguments on `devices` ranks."""
    config = json.loads(text)
    f = flags(" ".join(config["megatron_deepspeed_args"]))
    tp = int(f.get("tensor-model-parallel-size", 1))
    pp = int(f.get("pipeline-model-parallel-size", 1))
    cp = int(f.get("ds-sequence-parallel-size", 1))
    recompute = "none"
    if f.get("recompute-activations"):
        recompute = "selective"
    elif f.get("recompute-granularity") == "full":
        recompute = "full"
    block = recompute == "full" and f.get("recompute-method") == "block"
    zero = int(config["zero_optimization"]["stage"])
    precise = config.get("bf16", {}).get("enabled") and f.get("bf16")
    return Semantics(
        tp=tp, pp=pp, vpp=1, dp=devices // (tp * pp * cp), cp=cp,
        ep=int(f.get("moe-expert-parallel-size", 1)),
        mbs=int(config["train_micro_batch_size_per_gpu"]),
        global_batch=int(config["train_batch_size"]), recompute=recompute,
        zero=zero if int(f.get("zero-stage", zero)) == zero else -1,
        precision="bf16" if precise else "fp32",
        recompute_layers=int(f.get("recompute-num-layers", 1)) if block else 0,
        etp=(tp if f.get("enable-expert-tensor-parallelism") else 1) if "num-experts" in f else 0,
    )  # fmt: skip
