"""torchtitan 0.3 command-line options for a plan, and their read-back.

torchtitan 0.3 builds a job from a config-registry function (`--module llama3 --config
llama3_8b`: the model and its defaults) and takes every other setting as `--section.key`
options parsed by tyro; activation checkpointing is a subcommand
(`activation-checkpoint:selective|full|none`). No TOML file is read any more.

Contract: `torchtitan(plan, model, seq_len=, global_batch=)` returns those options for a
model torchtitan's registry has (`REGISTRY`), giving every degree (FSDP shard degree for
zero 2/3, replicate degree for zero 0/1), the pipeline schedule (`Interleaved1F1B` with
`pipeline_parallel_layers_per_stage` and the first/last-stage "less layers" chosen so
the stages come out pp x vpp, `1F1B`
otherwise), micro- and global batch (with PP the local batch is the replica's whole share,
cut into micro-batches; without PP it is one micro-batch and the rest is gradient
accumulation), recompute, compile and FSDP resharding. It raises `EmitRefusedError` for a
model outside the registry, a precision the registry config does not train in, or a
layout torchtitan cannot run (`argosy.planner.support`). `read_torchtitan(text)` parses
the options back into `Semantics`.
"""

from __future__ import annotations

import math
import shlex

from argosy.planner.models import ModelSpec
from argosy.planner.parallel import Parallel
from argosy.planner.readback import EmitRefusedError, Semantics
from argosy.planner.support import TORCHTITAN_REGISTRY as REGISTRY
from argosy.planner.support import Entry, refusal, stage_cut

FRAMEWORK = "torchtitan"


AC = {"none": "none", "selective": "selective", "full": "full"}


def registry_entry(model: ModelSpec, fp8: bool) -> Entry:
    """The registry function for `model`; `EmitRefusedError` when there is none that trains it
    in the plan's precision."""
    entry = REGISTRY.get(model.name)
    if entry is None or entry.layers != model.layers:
        known = ", ".join(sorted(REGISTRY))
        raise EmitRefusedError(
            f"torchtitan 0.3 builds models from its config registry only; {model.name!r} is "
            f"not one of its models ({known})"
        )
    if entry.fp8 != fp8:
        want, have = ("fp8", "bf16") if fp8 else ("bf16", "fp8")
        raise EmitRefusedError(
            f"torchtitan's {entry.config} config trains in {have} (its model registry's "
            f"converters, not a command-line option); the plan asks for {want}"
        )
    return entry


def torchtitan(p: Parallel, model: ModelSpec, *, seq_len: int, global_batch: int) -> str:
    """torchtitan 0.3 `torchtitan.train` options (torchtitan/config/configs.py fields)."""
    entry = registry_entry(model, p.fp8)
    why = refusal(FRAMEWORK, p, model, global_batch)
    if why:
        raise EmitRefusedError(why)
    sharded = p.zero >= 2
    opts = [
        f"--module {entry.module} --config {entry.config}",
        f"--training.local-batch-size {global_batch // p.dp if p.pp > 1 else p.mbs}",
        f"--training.global-batch-size {global_batch}",
        f"--training.seq-len {seq_len}",
        "--training.mixed-precision-param bfloat16",
        f"--parallelism.data-parallel-replicate-degree {1 if sharded else p.dp}",
        f"--parallelism.data-parallel-shard-degree {p.dp if sharded else 1}",
        f"--parallelism.tensor-parallel-degree {p.tp}",
        f"--parallelism.context-parallel-degree {p.cp}",
        f"--parallelism.expert-parallel-degree {p.ep}",
    ]
    if p.tp > 1 and not p.sp:
        opts.append("--parallelism.no-enable-sequence-parallel")
    opts += _pipeline(p, model)
    if sharded:  # zero=2: gather once per micro-batch; zero=3: again for the backward
        opts.append(
            f"--parallelism.fsdp-reshard-after-forward {'never' if p.zero == 2 else 'always'}"
        )
    opts.append("--compile.enable" if p.compile else "--compile.no-enable")
    async_tp = p.tp > 1 and p.compile  # async TP needs compile; registry configs may set it
    opts.append(f"--compile.{'' if async_tp else 'no-'}enable-async-tensor-parallel")
    if p.pp > 1 or p.ep > 1:  # torchtitan refuses CUDA graphs under PP and blocking EP
        opts.append("--training.disable-cuda-graphs")
    opts.append(f"activation-checkpoint:{AC[p.recompute]}")
    return " \\\n  ".join(opts)


def _pipeline(p: Parallel, model: ModelSpec) -> list[str]:
    if p.pp == 1:
        return []
    opts = [
        f"--parallelism.pipeline-parallel-degree {p.pp}",
        f"--parallelism.pipeline-parallel-microbatch-size {p.mbs}",
    ]
    if p.vpp == 1:
        return [*opts, "--parallelism.pipeline-parallel-schedule 1F1B"]
    cut = stage_cut(model.layers, p.pp * p.vpp)
    if cut is None:
        raise EmitRefusedError(
            f"torchtitan cannot cut {model.layers} layers into pp*vpp = {p.pp * p.vpp} stages"
        )
    return [
        *opts,
        "--parallelism.pipeline-parallel-schedule Interleaved1F1B",
        f"--parallelism.pipeline-parallel-layers-per-stage {cut[0]}",
        f"--parallelism.pipeline-parallel-first-stage-less-layers {cut[1]}",
        f"--parallelism.pipeline-parallel-last-stage-less-layers {cut[2]}",
    ]


def options(text: str) -> tuple[dict[str, str | bool], str]:
    """The `--key value` / `--flag` options and the activation-checkpoint subcommand."""
    tokens = shlex.split(text.replace("\\\n", " "))
    out: dict[str, str | bool] = {}
    sub = "selective"
    for i, tok in enumerate(tokens):
        if tok.startswith("activation-checkpoint:"):
            sub = tok.partition(":")[2]
        elif tok.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
            takes = nxt and not nxt.startswith("--") and ":" not in nxt
            out[tok[2:]] = nxt if takes else True
    return out, sub


def read_torchtitan(text: str) -> Semantics:
    """The plan semantics of torchtitan options (configs.py defaults for what is left out)."""
    o, ac = options(text)
    entry = next(e for e in REGISTRY.values() if e.config == o["config"])

    def get(key: str) -> int:
        return int(o.get(f"parallelism.{key}", 1))

    pp = get("pipeline-parallel-degree")
    replicate, shard = get("data-parallel-replicate-degree"), get("data-parallel-shard-degree")
    local = int(o["training.local-batch-size"])
    vpp = 1
    if o.get("parallelism.pipeline-parallel-schedule") == "Interleaved1F1B":
        per = get("pipeline-parallel-layers-per-stage")
        extra = get("pipeline-parallel-first-stage-less-layers")
        extra += get("pipeline-parallel-last-stage-less-layers")
        vpp = math.ceil((entry.layers + extra) / per) // pp
    reshard = o.get("parallelism.fsdp-reshard-after-forward")
    zero = 0 if reshard is None else 2 if reshard == "never" else 3
    tp, ep = get("tensor-parallel-degree"), get("expert-parallel-degree")
    return Semantics(
        tp=tp, pp=pp, vpp=vpp, dp=replicate * shard,
        cp=get("context-parallel-degree"), ep=ep,
        mbs=get("pipeline-parallel-microbatch-size") if pp > 1 else local,
        global_batch=int(o["training.global-batch-size"]), recompute=ac, zero=zero,
        precision="fp8" if entry.fp8 else "bf16",
        etp=(tp if ep == 1 else 1) if entry.moe else 0,  # experts whole under EP
    )  # fmt: skip
