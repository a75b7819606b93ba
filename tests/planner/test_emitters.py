"""Emitters against each framework's documented arguments (golden lists in golden/).

Megatron-LM and Megatron-DeepSpeed flags are parsed with an argparse parser built from
the documented flags (unknown flags, missing values and bad choices fail the parse);
torchtitan TOML with tomllib against the documented job-config fields; DeepSpeed JSON
against the documented config keys.
"""

import argparse
import json
import shlex
import tomllib
from pathlib import Path

import pytest

from argosy.planner.emit import emitters
from argosy.planner.models import load_model
from argosy.planner.parallel import parse_parallel

GOLDEN = Path(__file__).parent / "golden"
LAYOUTS = [
    "tp=8,pp=4,dp=2,vpp=2,mbs=1,recompute=selective,zero=1",
    "tp=2,pp=1,dp=32,mbs=2,recompute=full,zero=3,compile=1,fp8=1",
    "tp=4,pp=2,dp=8,mbs=1,recompute=none,zero=2,cp=2",
    "tp=1,pp=1,dp=64,mbs=1,recompute=none,zero=0",
]
MODELS = ["llama3-70b", "gpt3-175b", "mixtral-8x7b"]


def _rows(name: str) -> list[tuple[str, str]]:
    lines = (GOLDEN / name).read_text().splitlines()
    return [tuple(line.split()) for line in lines if line and not line.startswith("#")]


def _parser(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag, kind in _rows(name):
        if kind == "flag":
            parser.add_argument(flag, action="store_true")
        elif kind == "int":
            parser.add_argument(flag, type=int)
        elif kind == "str":
            parser.add_argument(flag)
        else:
            parser.add_argument(flag, choices=kind.split("|"))
    return parser


def _parse(parser: argparse.ArgumentParser, tokens: list[str]) -> argparse.Namespace:
    args, unknown = parser.parse_known_args(tokens)
    assert not unknown, f"undocumented flags: {unknown}"
    return args


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", MODELS)
def test_megatron_arguments_parse_with_the_documented_flags(model: str, layout: str) -> None:
    spec = load_model(model)
    plan = parse_parallel(layout + (",ep=2" if spec.is_moe else ""))
    text = emitters.get("megatron")(plan, spec, seq_len=4096, global_batch=256)
    args = _parse(_parser("megatron_args.txt"), shlex.split(text.replace("\\\n", " ")))
    assert args.tensor_model_parallel_size == plan.tp and args.global_batch_size == 256
    llama = spec.gated
    assert args.swiglu is llama and (args.normalization == "RMSNorm") is llama
    assert (args.position_embedding_type == "rope") is llama and args.disable_bias_linear is llama
    assert args.group_query_attention is (spec.kv != spec.heads)
    assert args.untie_embeddings_and_output_weights
    assert args.use_distributed_optimizer is (plan.zero in (1, 2))
    if spec.is_moe:
        assert args.expert_model_parallel_size == plan.ep and args.num_experts == spec.experts


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torchtitan_toml_uses_documented_fields(layout: str) -> None:
    plan = parse_parallel(layout)
    text = emitters.get("torchtitan")(plan, load_model("llama3-8b"), seq_len=8192, global_batch=256)
    doc = tomllib.loads(text)
    fields = dict(_rows("torchtitan_fields.txt"))
    types = {"int": int, "bool": bool, "str": str, "list": list}
    for section, values in doc.items():
        for key, value in values.items():
            kind = fields.get(f"{section}.{key}")
            assert kind is not None, f"undocumented field {section}.{key}"
            if kind in types:
                assert isinstance(value, types[kind]) and not (kind == "int" and value is True)
            else:
                assert value in kind.split("|"), (section, key, value)
    par = doc["parallelism"]
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == plan.dp
    assert doc["training"]["compile"] is plan.compile
    assert ("float8" in doc.get("model", {}).get("converters", [])) is plan.fp8


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", MODELS)
def test_deepspeed_config_keeps_expert_parallelism(model: str, layout: str) -> None:
    spec = load_model(model)
    plan = parse_parallel(layout + (",ep=2" if spec.is_moe else ""))
    text = emitters.get("deepspeed")(plan, spec, seq_len=4096, global_batch=256)
    config = json.loads(text)
    documented = dict(_rows("deepspeed_config_keys.txt"))

    def paths(node: dict, prefix: str = ""):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from paths(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    for path, _ in paths(config):
        assert path in documented, f"undocumented DeepSpeed key {path}"
    assert config["train_batch_size"] == 256 and config["zero_optimization"]["stage"] == plan.zero
    tokens = shlex.split(" ".join(config["megatron_deepspeed_args"]))
    args = _parse(_parser("megatron_deepspeed_args.txt"), tokens)
    assert args.tensor_model_parallel_size == plan.tp
    assert args.pipeline_model_parallel_size == plan.pp
    if spec.is_moe:
        assert args.moe_expert_parallel_size == plan.ep and args.num_experts == spec.experts
    assert not (args.sequence_parallel and args.ds_sequence_parallel_size)
