"""Megatron-LM `pretrain_gpt.py` arguments for a plan (Megatron-Core 0.16-0.19), and their
read-back.

Contract: `megatron(plan, model, seq_len=, global_batch=)` returns the flags (one per line,
joined with shell continuations) that give `plan` exactly: every degree, the virtual
pipeline degree (`--num-virtual-stages-per-pipeline-rank`, or a
`--pipeline-model-parallel-layout` when the layers do not divide into pp x vpp equal
stages: the first and last stages, which also hold the embedding and the loss, take the
missing layers), micro- and global batch, recompute, the distributed optimizer or
Megatron-FSDP (with its `fsdp_dtensor` checkpoint format) and bf16/fp8. A plan Megatron
cannot run raises `EmitRefusedError` with the reason (`argosy.planner.support`). The data,
tokenizer and schedule flags are the user's. Under TP or CP without Megatron-FSDP the
text starts with `export CUDA_DEVICE_MAX_CONNECTIONS=1` (Megatron asserts it).
`read_megatron(text, devices)` parses flags
back into the plan's semantics (`argosy.planner.readback`).
"""

from __future__ import annotations

import shlex

from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Parallel
from argosy.planner.readback import EmitRefusedError, Semantics
from argosy.planner.support import refusal

FRAMEWORK = "megatron-core"


def megatron(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """Megatron-LM `pretrain_gpt.py` arguments (flags of megatron/training/arguments.py)."""
    why = refusal(FRAMEWORK, p, model, global_batch)
    if why:
        raise EmitRefusedError(why)
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
    args += _architecture(model) + _moe(p, model) + _pipeline(p, model)
    if p.sp and p.tp > 1:
        args.append("--sequence-parallel")
    args += _memory(p)
    if p.flash:
        args.append("--attention-backend flash")
    if p.fp8:
        args.append("--fp8-format hybrid")
    return _environment(p) + " \\\n  ".join(args)


def _environment(p: Parallel) -> str:
    """Megatron (Hopper and earlier) asserts CUDA_DEVICE_MAX_CONNECTIONS=1 under TP or CP
    and asserts it is not 1 under Megatron-FSDP."""
    if (p.tp > 1 or p.cp > 1) and p.zero != 3:
        return "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
    return ""


def _architecture(model: ModelSpec) -> list[str]:
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
    if model.is_mla:
        args += ["--multi-latent-attention", f"--kv-lora-rank {model.kv_lora_rank}"]
        args += [f"--q-lora-rank {model.q_lora_rank}"] if model.q_lora_rank else []
        args += [
            f"--qk-head-dim {model.head_dim}",
            f"--qk-pos-emb-head-dim {model.qk_rope_dim}",
            f"--v-head-dim {model.v_dim}",
        ]
    elif model.heads * model.head_dim != model.hidden:
        args.append(f"--kv-channels {model.head_dim}")
    return args


def _moe(p: Parallel, model: ModelSpec) -> list[str]:
    if not model.is_moe:
        return []
    args = [f"--num-experts {model.experts}", f"--moe-router-topk {model.top_k}"]
    args.append(f"--expert-model-parallel-size {p.ep}")
    if p.expert_tp != p.tp:  # Megatron's default is tp
        args.append(f"--expert-tensor-parallel-size {p.expert_tp}")
    if model.moe_ffn:
        args.append(f"--moe-ffn-hidden-size {model.moe_ffn}")
    if model.shared_experts:
        args.append(
            f"--moe-shared-expert-intermediate-size {model.shared_experts * model.expert_ffn}"
        )
    return args


def _pipeline(p: Parallel, model: ModelSpec) -> list[str]:
    """VPP and uneven stages: equal stages use the plain degrees; otherwise a layout."""
    stages = p.pp * p.vpp
    if p.pp == 1 or model.layers % stages == 0:
        return [f"--num-virtual-stages-per-pipeline-rank {p.vpp}"] if p.vpp > 1 else []
    return [f"--pipeline-model-parallel-layout {shlex.quote(layout(model.layers, stages))}"]


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers per (virtual) stage in pipeline order: equal shares, the first and last
    stages (embedding, loss) taking what does not divide evenly."""
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1]
    for i in order[:extra]:
        counts[i] += 1
    return counts


def layout(layers: int, stages: int) -> str:
    """Megatron's `--pipeline-model-parallel-layout` string: E (embedding) in the first
    stage, L (loss) in the last, `t` per decoder layer, stages split by `|`."""
    counts = stage_layers(layers, stages)
    parts = ["t" * n for n in counts]
    parts[0] = "E" + parts[0]
    parts[-1] += "L"
    return "|".join(parts)


def _memory(p: Parallel) -> list[str]:
    """Recompute and ZeRO: zero=1 and zero=2 are the distributed optimizer (states sharded,
    gradients reduce-scattered and parameters gathered once per step, overlapped);
    zero=3 is Megatron-FSDP, which saves in its `fsdp_dtensor` format."""
    args = []
    if p.recompute == "selective":
        args.append("--recompute-activations")
    elif p.partial_recompute:  # the first k layers of each model chunk
        args += [
            "--recompute-granularity full",
            "--recompute-method block",
            f"--recompute-num-layers {p.recompute_layers}",
        ]
    elif p.recompute == "full":
        args += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    if p.zero in (1, 2):
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    elif p.zero == 3:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params"]
        args += ["--no-gradient-accumulation-fusion", "--overlap-grad-reduce"]
        args.append("--ckpt-format fsdp_dtensor")
    else:
        args.append("--overlap-grad-reduce")
    return args


def flags(text: str) -> dict[str, str | bool]:
    """The flags of an argument string: `--name value` or `--name` (True)."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("export "))
    tokens = shlex.split(body.replace("\\\n", " "), comments=True)
    out: dict[str, str | bool] = {}
    for i, tok in enumerate(tokens):
        if not tok.startswith("--"):
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        out[tok[2:]] = nxt if nxt is not None and not nxt.startswith("--") else True
    return out


def read_megatron(text: str, devices: int) -> Semantics:
    """The plan semantics of Megatron arguments on `devices` ranks (argparse defaults for
    what is left out)."""
    f = flags(text)
    tp, pp, cp = (int(f.get(k, 1)) for k in ("tensor-model-parallel-size",
                                              "pipeline-model-parallel-size",
                                              "context-parallel-size"))  # fmt: skip
    vpp = int(f.get("num-virtual-stages-per-pipeline-rank", 1))
    if "pipeline-model-parallel-layout" in f:
        vpp = (str(f["pipeline-model-parallel-layout"]).count("|") + 1) // pp
    recompute = "none"
    if f.get("recompute-activations") or f.get("recompute-granularity") == "selective":
        recompute = "selective"
    elif f.get("recompute-granularity") == "full":
        recompute = "full"
    zero = 3 if f.get("use-megatron-fsdp") else 1 if f.get("use-distributed-optimizer") else 0
    return Semantics(
        tp=tp, pp=pp, vpp=vpp, cp=cp, dp=devices // (tp * pp * cp),
        ep=int(f.get("expert-model-parallel-size", 1)), mbs=int(f["micro-batch-size"]),
        global_batch=int(f["global-batch-size"]), recompute=recompute, zero=zero,
        precision="fp8" if "fp8-format" in f else "bf16" if f.get("bf16") else "fp32",
        recompute_layers=_block_layers(f),
        etp=int(f.get("expert-tensor-parallel-size", tp)) if "num-experts" in f else 0,
    )  # fmt: skip


def _block_layers(f: dict) -> int:
    """Layers per model chunk recomputed under the block method; 0 for every layer."""
    if f.get("recompute-granularity") != "full" or f.get("recompute-method") != "block":
        return 0
    return int(f.get("recompute-num-layers", 1))
