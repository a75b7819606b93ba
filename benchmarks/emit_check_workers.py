"""Workers of benchmarks/emit_check.py: each runs inside one framework's installed code
(its own PYTHONPATH, a separate process) and feeds argosy's emitted configs to that
framework's own parser and validation, then reads what the framework understood.

    python benchmarks/emit_check_workers.py megatron|torchtitan|deepspeed IN.json OUT.json

IN holds items {id, text, devices, shape}; OUT gets {id: {accepted, error, parsed, shape}}.
`parsed` is in argosy's `Semantics` terms, taken from the framework's parsed objects (not
from argosy's read-back). Only the standard library and the framework are imported here.

What runs, per framework:
- Megatron-LM (a tag of NVIDIA/Megatron-LM): `parse_args`, `validate_args` and
  `core_transformer_config_from_args` (TransformerConfig's own checks, pipeline layout
  included), on a node that reports an H100 (compute capability 9.0) with Transformer
  Engine's fused RoPE present; the interleaved schedule's micro-batch check, which runs at
  the first step, is restated from core/pipeline_parallel/schedules.py.
- torchtitan 0.3 (capability queries answered as an H100, SM 9.0, for Float8):
  `ConfigManager().parse_args` (tyro and the Trainer config's checks),
  `ParallelDims` (degrees against the world size), the pipeline stage count
  (`_get_pipeline_metadata`, `_generate_llm_fqn_per_model_part`); the schedule's
  micro-batch rules are restated from torch.distributed.pipelining.
- DeepSpeed 0.19 + Megatron-DeepSpeed: its `parse_args`/`validate_args`, `DeepSpeedConfig`
  on the JSON with the data-parallel size of the layout, and the pipeline engine's
  "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" check.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
import types

MEGATRON_USER_ARGS = ["--train-iters", "10", "--lr", "1e-4", "--mock-data"]
MEGATRON_USER_ARGS += ["--tokenizer-type", "NullTokenizer", "--vocab-size", "128000"]
MDS_USER_ARGS = ["--train-iters", "10", "--lr", "1e-4"]


def _h100() -> None:
    """Answer device queries as an H100 node would (the parsers ask for the arch)."""
    import torch

    props = types.SimpleNamespace(
        major=9,
        minor=0,
        name="NVIDIA H100 80GB HBM3",
        total_memory=80 * 2**30,
        multi_processor_count=132,
    )
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)


def _split(text: str) -> tuple[dict[str, str], list[str]]:
    env, body = {}, []
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = value
        else:
            body.append(line)
    return env, shlex.split("\n".join(body).replace("\\\n", " "))


def _error(err: BaseException) -> str:
    if isinstance(err, SystemExit):
        return f"argparse exit {err.code}"
    last = traceback.format_exception_only(type(err), err)[-1].strip()
    return last[:400]


def megatron(items: list[dict]) -> dict:
    import typing

    import typing_extensions

    typing.override = typing_extensions.override  # 0.19 imports it (Python 3.12)
    _h100()
    import megatron.core.models.common.embeddings.rope_utils as rope
    from megatron.training import arguments

    rope.fused_apply_rotary_pos_emb = rope.fused_apply_rotary_pos_emb or (lambda *a: None)
    out = {}
    for item in items:
        env, tokens = _split(item["text"])
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(env, WORLD_SIZE=str(item["devices"]), RANK="0", LOCAL_RANK="0")
        sys.argv = ["pretrain_gpt.py", *tokens, *MEGATRON_USER_ARGS]
        try:
            args = arguments.parse_args()
            arguments.validate_args(args, {})
            config = arguments.core_transformer_config_from_args(args)
            _interleaved_microbatches(args, config)
            out[item["id"]] = {"accepted": True, **_megatron_parsed(args)}
        except BaseException as err:  # noqa: BLE001 - the framework's verdict, recorded
            out[item["id"]] = {"accepted": False, "error": _error(err)}
    return out


def _interleaved_microbatches(args, config) -> None:
    """core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving."""
    if not args.virtual_pipeline_model_parallel_size:
        return
    pp = args.pipeline_model_parallel_size
    m = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    group = getattr(config, "microbatch_group_size_per_vp_stage", None) or pp
    if group > m or group < pp:
        raise ValueError(f"contiguous micro-batches per virtual stage must be in [PP={pp}, M={m}]")
    if 0 < m % group < pp:
        raise RuntimeError(f"the remainder of M={m} by N={group} is below PP={pp}")


def _block_layers(args) -> int:
    """Layers per model chunk the parsed arguments recompute under the block method."""
    if args.recompute_granularity != "full" or args.recompute_method != "block":
        return 0
    return int(args.recompute_num_layers)


def _megatron_parsed(args) -> dict:
    recompute = args.recompute_granularity or "none"
    zero = 3 if args.use_megatron_fsdp else 1 if args.use_distributed_optimizer else 0
    parsed = {
        "tp": args.tensor_model_parallel_size,
        "pp": args.pipeline_model_parallel_size,
        "vpp": args.virtual_pipeline_model_parallel_size or 1,
        "dp": args.data_parallel_size,
        "cp": args.context_parallel_size,
        "ep": args.expert_model_parallel_size,
        "mbs": args.micro_batch_size,
        "global_batch": args.global_batch_size,
        "recompute": recompute,
        "zero": zero,
        "precision": "fp8" if args.fp8 else "bf16" if args.bf16 else "fp32",
        "recompute_layers": _block_layers(args),
        "etp": args.expert_tensor_parallel_size if args.num_experts else 0,
    }
    shape = {"layers": args.num_layers, "hidden": args.hidden_size}
    shape |= {"heads": args.num_attention_heads, "experts": args.num_experts or 1}
    shape["head_dim"] = args.kv_channels  # validate_args: hidden / heads unless given
    mla = bool(getattr(args, "multi_latent_attention", False))
    shape["kv_lora_rank"] = args.kv_lora_rank if mla else 0
    if mla:
        shape |= {"qk_head_dim": args.qk_head_dim, "v_head_dim": args.v_head_dim}
        shape["qk_pos_emb_head_dim"] = args.qk_pos_emb_head_dim
    return {"parsed": parsed, "shape": shape}


def torchtitan(items: list[dict]) -> dict:
    import torchtitan.components.quantization.float8 as float8
    import torchtitan.tools.utils as tools
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed import pipeline_parallel as pipe
    from torchtitan.distributed.parallel_dims import ParallelDims

    def h100(major: int, minor: int) -> bool:  # the node the config is for: SM 9.0
        return (major, minor) <= (9, 0)

    tools.has_cuda_capability = float8.has_cuda_capability = h100
    out = {}
    for item in items:
        _, tokens = _split(item["text"])
        try:
            config = ConfigManager().parse_args(tokens)
            dims = ParallelDims.from_config(config.parallelism, item["devices"])
            _titan_mesh(dims)
            vpp = _titan_stages(pipe, dims, config) // dims.pp
            out[item["id"]] = {"accepted": True, **_titan_parsed(config, dims, vpp)}
        except BaseException as err:  # noqa: BLE001 - the framework's verdict, recorded
            out[item["id"]] = {"accepted": False, "error": _error(err)}
    return out


def _titan_stages(pipe, dims, config) -> int:
    """Stages torchtitan builds; the micro-batch rules of torch.distributed.pipelining."""
    if dims.pp == 1:
        return 1
    model = config.model_spec.model
    stages, layers, first, last = pipe._get_pipeline_metadata(dims, config.parallelism, model)
    pipe._generate_llm_fqn_per_model_part(stages, layers, first, last)
    m = config.training.local_batch_size // config.parallelism.pipeline_parallel_microbatch_size
    if stages == dims.pp and m < stages:  # Schedule1F1B
        raise ValueError(f"{m} micro-batches < {stages} stages")
    rounds = max(1, m // dims.pp)  # ScheduleInterleaved1F1B
    if stages > dims.pp and m % rounds:
        raise ValueError(f"{m} micro-batches not a multiple of {rounds} rounds")
    return stages


def _titan_moe(model) -> bool:
    return any(getattr(layer, "moe", None) is not None for layer in model.layers)


def _titan_mesh(dims) -> None:
    """Build the device meshes as torchtitan does at start-up (dense and sparse: EP's
    efsdp = dp_shard*cp*tp/ep must be whole), over a fake process group of the job's
    world size: the arithmetic ParallelDims leaves to `build_mesh` is checked too."""
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dims.world_size)
    parallel_dims.device_type = "cpu"
    try:
        dims.build_mesh()
    finally:
        dist.destroy_process_group()


def _titan_parsed(config, dims, vpp: int) -> dict:
    ac = type(config.activation_checkpoint).__qualname__.lower()
    recompute = next((r for r in ("selective", "full") if r in ac), "none")
    par = config.parallelism
    sharded = dims.dp_shard > 1
    zero = (2 if par.fsdp_reshard_after_forward == "never" else 3) if sharded else 0
    fp8 = "float8" in repr(config.model_spec).lower()
    model = config.model_spec.model
    parsed = {
        "tp": dims.tp,
        "pp": dims.pp,
        "vpp": vpp,
        "dp": dims.dp_replicate * dims.dp_shard,
        "cp": dims.cp,
        "ep": dims.ep,
        "mbs": par.pipeline_parallel_microbatch_size
        if dims.pp > 1
        else config.training.local_batch_size,
        "global_batch": config.training.global_batch_size,
        "recompute": recompute,
        "zero": zero,
        "precision": "fp8"
        if fp8
        else "bf16"
        if config.training.mixed_precision_param == "bfloat16"
        else "fp32",
        "recompute_layers": 0,  # torchtitan has no block method
        # routed experts: whole under EP (sparse mesh without TP), split over TP without
        "etp": (dims.tp if dims.ep == 1 else 1) if _titan_moe(model) else 0,
    }
    shape = {"layers": len(model.layers), "hidden": getattr(model, "dim", None)}
    return {"parsed": parsed, "shape": shape}


def deepspeed(items: list[dict]) -> dict:
    import tempfile

    from deepspeed.runtime import config as ds_config
    from megatron import arguments

    ds_config.dist.get_rank = lambda *a, **k: 0
    out = {}
    for item in items:
        doc = json.loads(item["text"])
        tokens = shlex.split(" ".join(doc.pop("megatron_deepspeed_args")))
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(doc, f)
        if "--deepspeed_config" in tokens:
            tokens[tokens.index("--deepspeed_config") + 1] = f.name
        else:  # an emitter that left the launcher's DeepSpeed flags to the user
            tokens += ["--deepspeed", "--deepspeed_config", f.name]
        os.environ.update(WORLD_SIZE=str(item["devices"]), RANK="0", LOCAL_RANK="0")
        sys.argv = ["pretrain_gpt.py", *tokens, *MDS_USER_ARGS]
        try:
            args = arguments.parse_args()
            arguments.validate_args(args, {})
            out[item["id"]] = {"accepted": True, **_ds_parsed(ds_config, f.name, args, item)}
        except BaseException as err:  # noqa: BLE001 - the framework's verdict, recorded
            out[item["id"]] = {"accepted": False, "error": _error(err)}
    return out


def _ds_parsed(ds_config, path: str, args, item: dict) -> dict:
    tp, cp = args.tensor_model_parallel_size, args.ds_sequence_parallel_size
    pp = 1 if args.no_pipeline_parallel else args.pipeline_model_parallel_size
    dp = item["devices"] // (tp * pp * cp)
    mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: dp)
    cfg = ds_config.DeepSpeedConfig(path, mpu=mpu)
    if pp > 1 and cfg.zero_optimization_stage >= 2:  # deepspeed/runtime/pipe/engine.py
        raise AssertionError("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    if args.zero_stage != cfg.zero_optimization_stage:
        raise AssertionError(f"--zero-stage {args.zero_stage} != JSON stage")
    bf16 = cfg.bfloat16_config.enabled if hasattr(cfg, "bfloat16_config") else cfg.bfloat16_enabled
    parsed = {
        "tp": tp,
        "pp": pp,
        "vpp": 1,
        "dp": dp,
        "cp": cp,
        "ep": args.moe_expert_parallel_size,
        "mbs": cfg.train_micro_batch_size_per_gpu,
        "global_batch": cfg.train_batch_size,
        "recompute": args.recompute_granularity or "none",
        "zero": cfg.zero_optimization_stage,
        "precision": "bf16" if bf16 and args.bf16 else "fp32",
        "recompute_layers": _block_layers(args),
    }
    if args.num_experts[0] > 1:  # experts whole on each device unless expert TP is on
        parsed["etp"] = tp if args.enable_expert_tensor_parallelism else 1
    else:
        parsed["etp"] = 0
    experts = args.num_experts[0]  # every layer MoE only with --expert-interval 1
    experts = experts if experts == 1 or args.expert_interval == 1 else -args.expert_interval
    shape = {"layers": args.num_layers, "hidden": args.hidden_size}
    shape |= {"heads": args.num_attention_heads, "experts": experts}
    shape["head_dim"] = args.kv_channels
    shape["kv_lora_rank"] = 0  # Megatron-DeepSpeed has no latent attention
    return {"parsed": parsed, "shape": shape}


def main() -> None:
    kind, src, dst = sys.argv[1:4]
    with open(src) as f:
        items = json.load(f)
    worker = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed}[kind]
    results = worker(items)
    with open(dst, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
