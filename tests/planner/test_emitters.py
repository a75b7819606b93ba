"""Emitters against what the real frameworks' parsers accepted (golden/emitted/), and
plan -> emitted config -> read-back round trips over many plans (hypothesis).

The golden files are written by `benchmarks/emit_check.py --golden`, which ran each
emitted config through Megatron-LM (core_v0.16.1 to core_v0.19.0) `parse_args` +
`validate_args` + TransformerConfig, torchtitan 0.3.0's ConfigManager + ParallelDims +
pipeline split, and DeepSpeed 0.19.8's DeepSpeedConfig + Megatron-DeepSpeed's arguments,
and stored the text with what each parser understood. Here argosy must emit the same text
for the same plan, and its own read-back must agree with every parser's.
"""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.planner.emit import emitters, framework_of, readers
from argosy.planner.emit_megatron import layout, stage_layers
from argosy.planner.emit_torchtitan import REGISTRY
from argosy.planner.models import load_model
from argosy.planner.parallel import Parallel
from argosy.planner.readback import EmitRefusedError, expected, mismatches
from argosy.planner.support import refusal, stage_cut

GOLDEN = sorted((Path(__file__).parent / "golden" / "emitted").glob("*.json"))


def _model_of(case: str):
    return load_model(case.split("/")[0])


def test_golden_files_cover_every_emitter_and_parser_run() -> None:
    docs = [json.loads(p.read_text()) for p in GOLDEN]
    assert {d["emitter"] for d in docs} == {"megatron", "torchtitan", "deepspeed"}
    runs = {run for d in docs for run in d["parsed"]}
    assert {"Megatron-LM core_v0.16.1", "Megatron-LM core_v0.19.0"} <= runs
    assert any("405b" in d["case"] and d["emitter"] == "megatron" for d in docs)


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_emitter_reproduces_what_the_real_parser_accepted(path: Path) -> None:
    doc = json.loads(path.read_text())
    plan, model = Parallel(**doc["parallel"]), _model_of(doc["case"])
    text = emitters.get(doc["emitter"])(
        plan, model, seq_len=doc["seq_len"], global_batch=doc["global_batch"]
    )
    assert text == doc["text"]
    own = readers[doc["emitter"]](text, doc["devices"])
    want = expected(plan, doc["global_batch"], framework_of(doc["emitter"]), model.is_moe)
    for run, parsed in doc["parsed"].items():
        assert own.as_dict() == parsed, run
        assert mismatches(want, parsed) == [], run


@st.composite
def plans(draw):
    """Valid-looking layouts of the models the emitters know (degrees divide the model)."""
    model = load_model(
        draw(
            st.sampled_from(
                ["llama3-8b", "llama3-405b", "mixtral-8x7b", "deepseek-v3-like", "gpt3-175b"]
            )
        )
    )
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if model.kv % t == 0]))
    pp = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    vpp = 1 if pp == 1 else draw(st.sampled_from([1, 2, 3, 4]))
    dp, cp = draw(st.sampled_from([1, 2, 4, 8, 16])), draw(st.sampled_from([1, 2, 4]))
    etp = draw(st.sampled_from([0, 1])) if model.is_moe and tp > 1 else 0
    holders = dp * cp * tp // (etp or tp)  # ranks that can hold different experts
    ep = draw(
        st.sampled_from([e for e in (1, 2, 4, 8) if model.experts % e == 0 and holders % e == 0])
    )
    mbs = draw(st.sampled_from([1, 2, 4]))
    batch = dp * mbs * draw(st.integers(1, 24))
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    chunk = -(-model.layers // (pp * vpp))
    partial = draw(st.integers(0, chunk - 1)) if recompute == "full" and chunk > 1 else 0
    plan = Parallel(
        tp=tp,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=mbs,
        cp=cp,
        ep=ep,
        etp=etp,
        sp=tp > 1,
        recompute=recompute,
        recompute_layers=partial,
        zero=draw(st.integers(0 if dp * cp == 1 else 0, 3 if dp * cp > 1 else 0)),
        compile=draw(st.booleans()),
        fp8=draw(st.booleans()),
    )
    return plan, model, batch, draw(st.sampled_from(["megatron", "torchtitan", "deepspeed"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_emitted_config_reads_back_as_the_plan_or_is_refused_with_a_reason(case) -> None:
    plan, model, batch, emitter = case
    if plan.pp * plan.vpp > model.layers:
        return
    framework = framework_of(emitter)
    try:
        text = emitters.get(emitter)(plan, model, seq_len=4096, global_batch=batch)
    except EmitRefusedError as err:
        assert str(err)  # a reason, whether a layout rule or the model registry
        return
    assert refusal(framework, plan, model, batch) is None
    got = readers[emitter](text, plan.devices)
    assert mismatches(expected(plan, batch, framework, model.is_moe), got) == []


@given(st.integers(1, 200), st.integers(1, 64))
def test_megatron_layout_places_every_layer_once(layers: int, stages: int) -> None:
    if stages > layers:
        return
    counts = stage_layers(layers, stages)
    assert sum(counts) == layers and len(counts) == stages and max(counts) - min(counts) <= 1
    text = layout(layers, stages)
    assert text.startswith("E") and text.endswith("L") and text.count("t") == layers


@given(st.sampled_from(sorted(REGISTRY)), st.integers(2, 32), st.integers(2, 4))
def test_torchtitan_stage_cut_gives_exactly_pp_times_vpp_stages(name, pp, vpp) -> None:
    layers = REGISTRY[name].layers
    cut = stage_cut(layers, pp * vpp)
    if cut is None:  # then no weights torchtitan accepts give that many stages
        assert not any(
            -(-(layers + f + g) // per) == pp * vpp and max(f, g) <= (layers + f + g) // (pp * vpp)
            for f in range(16)
            for g in range(16)
            for per in range(1, layers + 33)
        )
        return
    per, first, last = cut
    stages = pp * vpp
    assert -(-(layers + first + last) // per) == stages
    assert max(first, last) <= (layers + first + last) // stages


def test_refusals_name_the_framework_rule() -> None:
    model = load_model("llama3-70b")
    zero3_pp = Parallel(tp=8, pp=4, dp=16, zero=3)
    with pytest.raises(EmitRefusedError, match="ZeRO stage 0 or 1"):
        emitters.get("deepspeed")(zero3_pp, model, seq_len=4096, global_batch=64)
    odd = Parallel(tp=8, pp=4, vpp=2, dp=2, mbs=1)  # 65 micro-batches: not a multiple of 4
    with pytest.raises(EmitRefusedError, match="multiple of pp=4"):
        emitters.get("megatron")(odd, model, seq_len=4096, global_batch=130)
    with pytest.raises(EmitRefusedError, match="config registry"):
        emitters.get("torchtitan")(
            Parallel(dp=8), load_model("mixtral-8x7b"), seq_len=4096, global_batch=64
        )


def test_torchtitan_prices_405b_in_the_precision_its_registry_trains() -> None:
    from argosy.hardware.loader import load_cluster
    from argosy.planner.search import search_group

    model = load_model("llama3-405b")
    group = load_cluster("h100:512").groups[0]
    ranked = search_group(model, group, 8192, 256, framework="torchtitan")
    assert len(ranked) and all(ranked.plan(r).fp8 for r in range(min(5, len(ranked))))
    best = ranked.plan(0)
    text = emitters.get("torchtitan")(best, model, seq_len=8192, global_batch=256)
    assert "--config llama3_405b" in text
    with pytest.raises(EmitRefusedError, match="trains in fp8"):
        emitters.get("torchtitan")(
            Parallel(**{**best.as_dict(), "fp8": False}), model, seq_len=8192, global_batch=256
        )


def test_estimate_names_the_framework_rule_a_layout_breaks() -> None:
    from argosy.hardware.loader import load_cluster
    from argosy.planner.api import estimate

    odd = Parallel(tp=8, pp=2, vpp=2, dp=1, mbs=1)  # 65 micro-batches: not a multiple of 2
    out = estimate(load_model("llama3-70b"), load_cluster("h100:16"), odd, 4096, 65)
    assert not out["feasible"] and any("interleaved schedule" in r for r in out["reasons"])
    even = estimate(load_model("llama3-70b"), load_cluster("h100:16"), odd, 4096, 64)
    assert not any("interleaved schedule" in r for r in even["reasons"])
