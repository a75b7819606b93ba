"""Model specs: presets match published sizes; every input form parses; bad input is named."""

import json

import pytest

from argosy.core.errors import ConfigError, UnknownNameError
from argosy.planner.models import load_model, presets

PUBLISHED_PARAMS_B = [
    ("llama3-8b", 8.03),
    ("llama3-70b", 70.55),
    ("llama3-405b", 405.85),
    ("gpt3-175b", 175.2),
    ("mixtral-8x7b", 46.7),
    ("qwen2.5-72b", 72.7),
    ("qwen3-30b-a3b", 30.5),
    ("qwen3-235b-a22b", 235.1),
    ("gpt-oss-120b", 116.8),
]


@pytest.mark.parametrize(
    ("name", "billions"), PUBLISHED_PARAMS_B, ids=[p[0] for p in PUBLISHED_PARAMS_B]
)
def test_preset_parameter_counts_match_published(name: str, billions: float) -> None:
    assert load_model(name).total_params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_mixtral_active_parameters_are_about_13b() -> None:
    assert load_model("mixtral-8x7b").active_params() / 1e9 == pytest.approx(12.9, rel=0.03)


def test_required_presets_exist() -> None:
    names = set(presets())
    assert {"llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "mixtral-8x7b"} <= names
    assert {"qwen2.5-72b", "deepseek-v3-like", "gpt-1.7b", "gpt-1t"} <= names


def test_inline_shape_equals_the_preset_it_describes() -> None:
    inline = load_model("layers=96,hidden=12288,heads=96,vocab=51200")
    assert inline.total_params() == load_model("gpt3-175b").total_params()


def test_inline_moe_fields() -> None:
    spec = load_model(
        "layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,experts=8,top_k=2,gated=true"
    )
    assert spec.is_moe and spec.top_k == 2 and spec.kv == 8 and spec.mlp_mats == 3


def test_hugging_face_config(tmp_path) -> None:
    cfg = {
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        "vocab_size": 128256,
        "hidden_act": "silu",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_model(str(path)).total_params() == load_model("llama3-70b").total_params()


def test_yaml_model_file(tmp_path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: tiny\nlayers: 4\nhidden: 256\nheads: 4\n")
    assert load_model(str(path)).layers == 4


def test_yaml_model_file_error_points_at_line(tmp_path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("layers: 4\nhidden: 256\nheads: 4\nwidth: 3\n")
    with pytest.raises(ConfigError) as err:
        load_model(str(path))
    assert ":4" in str(err.value) and "width" in str(err.value)


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        load_model("llama3-9b")
    assert "llama3-8b" in str(err.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("layers=4,hidden=256", "heads"),
        ("layers=4,hidden=250,heads=4,depth=3", "depth"),
        ("layers=x,hidden=4,heads=1", "layers"),
    ],
    ids=["missing-heads", "unknown-key", "not-a-number"],
)
def test_bad_inline_shapes_are_named(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_model(text)
    assert needle in str(err.value)


def test_heads_must_divide_hidden() -> None:
    with pytest.raises(ConfigError) as err:
        load_model("layers=2,hidden=100,heads=3")
    assert "head_dim" in str(err.value)


def test_head_dim_defaults_to_width_over_heads() -> None:
    spec = load_model("llama3-8b")
    assert spec.head_dim == 128 and spec.q_width == spec.o_width == spec.hidden
    assert spec.k_width == spec.v_width == 8 * 128 and not spec.is_mla
    same = load_model("layers=32,hidden=4096,heads=32,kv_heads=8,head_dim=128,ffn=14336,gated=1")
    assert same.attn_params() == spec.attn_params()


def test_head_dim_apart_from_the_width_widens_the_attention() -> None:
    """Qwen3-30B-A3B: 32 heads of 128 on a 2,048-wide model, so q and the attention output
    are 4,096 wide; per layer Q 2048x4096, K and V 2048x512 each, O 4096x2048."""
    spec = load_model("qwen3-30b-a3b")
    assert spec.q_width == spec.o_width == 4096 and spec.k_width == spec.v_width == 512
    assert spec.attn_params() == 2048 * 4096 * 2 + 2 * 2048 * 512
    narrow = spec.model_copy(update={"head_dim": 64})
    assert narrow.forward_flops_per_token(4096) < spec.forward_flops_per_token(4096)


def test_hugging_face_config_reads_head_dim(tmp_path) -> None:
    cfg = {
        "num_hidden_layers": 36,
        "hidden_size": 2880,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2880,
        "vocab_size": 201088,
        "hidden_act": "silu",
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert spec.q_width == 4096 and spec.experts == 128 and spec.top_k == 4
    assert spec.total_params() == load_model("gpt-oss-120b").total_params()


def test_latent_attention_of_deepseek_v3() -> None:
    """DeepSeek-V3's MLA per layer: q down 7168x1536 and up 1536x(128 x 192), the joint
    key/value latent 7168x(512+64) and its up-projection 512x(128 x (128+128)), output
    (128 x 128)x7168; attention reads 192-wide query/key heads and 128-wide values."""
    spec = load_model("deepseek-v3-like")
    assert spec.is_mla and spec.q_width == spec.k_width == 128 * 192
    assert spec.o_width == spec.v_width == 128 * 128
    want = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert spec.attn_params() == want
    assert spec.active_params() / 1e9 == pytest.approx(37.6, rel=0.01)  # published: 37B


def test_hugging_face_config_reads_latent_attention(tmp_path) -> None:
    cfg = {
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "vocab_size": 129280,
        "hidden_act": "silu",
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_model(str(path)).attn_params() == load_model("deepseek-v3-like").attn_params()


def test_latent_attention_fields_need_a_latent() -> None:
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        load_model("layers=2,hidden=256,heads=4,qk_rope_dim=16")
