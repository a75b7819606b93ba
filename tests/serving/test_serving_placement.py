"""`--device` and `--dtype`: resolution over every host shape, the ledger's device key, the
budget in the held dtype, and an engine serving a bf16 checkpoint in each dtype (CPU)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from argosy.serving import ENGINES, EngineConfig, GenerationRequest, SamplingParams, placement
from argosy.serving.budget import kv_bytes_per_token, weights_bytes
from argosy.serving.placement import PlacementError
from argosy.serving.synthetic import write_checkpoint

DEVICE_SPECS = st.one_of(
    st.sampled_from(["auto", "cpu", "cuda", "CUDA", " cpu "]),
    st.integers(0, 9).map(lambda n: f"cuda:{n}"),
)


@given(DEVICE_SPECS, st.integers(0, 8))
def test_every_device_resolves_to_a_device_the_host_has_or_a_clear_error(spec, count):
    try:
        device = placement.resolve_device(spec, count)
    except PlacementError as err:
        assert err.field == "device"
        assert "not on this host" in str(err) and "use auto or cpu" in str(err)
        assert spec.strip().lower().startswith("cuda")
        return
    if device == "cpu":
        assert spec.strip().lower() == "cpu" or (spec == "auto" and count == 0)
    else:
        index = int(device.removeprefix("cuda:"))
        assert 0 <= index < count
        if spec == "auto":
            assert index == 0


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cuda:-1", "gpu0", "", "cuda:1:2"])
def test_malformed_devices_list_the_accepted_forms(bad):
    with pytest.raises(PlacementError, match=r"accepted forms: auto, cpu, cuda, cuda:<index>"):
        placement.parse_device(bad)


@given(
    st.sampled_from(["cpu", "cuda:0", "cuda:3"]),
    st.sampled_from([None, "float32", "bfloat16", "float16"]),
    st.booleans(),
)
def test_auto_dtype_is_fp32_on_cpu_and_16_bit_on_a_gpu(device, checkpoint, bf16):
    dtype = placement.resolve_dtype("auto", device, checkpoint, bf16)
    if device == "cpu":
        assert dtype == "float32"
    elif checkpoint == "float16" or not bf16:
        assert dtype == "float16"
    else:
        assert dtype == "bfloat16"


@pytest.mark.parametrize(
    "spec,want",
    [("bf16", "bfloat16"), ("FP16", "float16"), ("half", "float16"), ("fp32", "float32")],
)
def test_dtype_aliases(spec, want):
    assert placement.resolve_dtype(spec, "cuda:0", None) == want


def test_bad_dtypes_are_refused_naming_the_known_ones():
    with pytest.raises(PlacementError, match="auto, bfloat16, float16, float32"):
        placement.parse_dtype("int8")
    with pytest.raises(PlacementError, match="no bfloat16"):
        placement.resolve_dtype("bfloat16", "cuda:0", None, bf16_supported=False)


def test_engine_config_checks_and_normalizes_the_fields():
    assert EngineConfig(device="CUDA").device == "cuda:0"
    assert EngineConfig(dtype="bf16").dtype == "bfloat16"
    for field, bad in (("device", "tpu"), ("dtype", "int4")):
        with pytest.raises(ValidationError) as err:
            EngineConfig(**{field: bad})
        assert err.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(
    "visible,device,key",
    [
        (None, "cuda:1", "cuda-1"),
        ("2,3", "cuda:1", "cuda-3"),
        ("GPU-ab12", "cuda:0", "cuda-GPU-ab12"),
    ],
)
def test_ledger_key_names_the_physical_device(monkeypatch, visible, device, key):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert placement.device_key(device) == key
    assert placement.device_key("cpu") == "cpu"


@pytest.mark.parametrize(
    "visible,want", [(None, 4), ("1,2", 2), ("0,-1,3", 1), ("", 0), ("0,1,2,3,4,5", 4)]
)
def test_visible_count_follows_cuda_visible_devices(monkeypatch, visible, want):
    monkeypatch.setattr(placement, "_nvml_count", lambda: 4)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert placement.visible_cuda_count() == want


@pytest.mark.parametrize("args", [["--device", "tpu"], ["--dtype", "int8"]])
def test_cli_refuses_bad_placements_with_exit_2(args):
    from typer.testing import CliRunner

    from argosy.cli.app import app

    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert "unknown" in result.output and "Traceback" not in result.output


# -- a bf16 checkpoint, held in each dtype ------------------------------------------------
@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny-bf16"), "tiny", "bfloat16")


def test_the_budget_counts_weights_in_the_dtype_they_are_held_in(bf16_checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bf16_checkpoint)
    elements = sum(p.numel() for p in model.parameters())  # tied: the embedding once
    assert weights_bytes(bf16_checkpoint, 2) == 2 * elements
    assert weights_bytes(bf16_checkpoint, 4) == 4 * elements
    assert kv_bytes_per_token(bf16_checkpoint, 4) == 2 * kv_bytes_per_token(bf16_checkpoint, 2)
    assert placement.checkpoint_dtype(bf16_checkpoint) == "bfloat16"


def _engine(path, **fields):
    engine = ENGINES.get("transformers")(
        EngineConfig(model=str(path), speculative="off", num_threads=1, **fields)
    )
    engine.load()
    return engine


@pytest.mark.parametrize("dtype,want", [("auto", torch.float32), ("bfloat16", torch.bfloat16)])
def test_greedy_tokens_equal_generate_in_the_served_dtype(bf16_checkpoint, dtype, want):
    engine = _engine(bf16_checkpoint, dtype=dtype)
    assert engine.placement == placement.Placement("cpu", str(want).removeprefix("torch."))
    model = engine._model
    assert {p.dtype for p in model.parameters()} == {want}
    for text in ("Repeat the list", "write a short story about a ship"):
        ids = engine.encode_chat([{"role": "user", "content": text}])
        ours = engine.generate(
            GenerationRequest(prompt_ids=tuple(ids), params=SamplingParams(max_tokens=24))
        ).token_ids
        with torch.inference_mode():
            theirs = model.generate(
                torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None
            )[0, len(ids) :].tolist()
        assert list(ours) == theirs[: len(ours)] and ours


def test_a_fraction_that_holds_bf16_but_not_fp32_weights_loads_only_in_bf16(bf16_checkpoint):
    from argosy.core.errors import ArgosyError

    weights16 = weights_bytes(bf16_checkpoint, 2)
    device_bytes = int(weights16 / 0.5 / 0.9) + 1  # bf16 weights take half the budget
    fields = {"memory_fraction": 0.5, "device_memory_bytes": device_bytes}
    held = _engine(bf16_checkpoint, dtype="bfloat16", **fields)
    assert held.budget is not None and held.budget.weights_bytes == weights16
    with pytest.raises(ArgosyError, match="weights alone"):
        _engine(bf16_checkpoint, dtype="float32", **fields)
