"""Transformer model specs: presets, Hugging Face `config.json`, YAML files, inline text.

`load_model(text)` accepts any of

    llama3-70b                                   a preset (see `PRESETS`)
    path/to/config.json                          a Hugging Face config
    path/to/model.yaml                           a `ModelSpec` as YAML
    layers=96,hidden=12288,heads=96[,kv_heads=..,ffn=..,vocab=..,experts=..,top_k=..]

and returns a frozen `ModelSpec`. Unknown presets raise `UnknownNameError` listing the
known ones; malformed text or files raise `ConfigError` naming the field.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from argosy.core.documents import load_yaml, validate
from argosy.core.errors import ConfigError, UnknownNameError

PRESETS_PATH = Path(__file__).parent / "data" / "models.yaml"
INLINE_KEYS = {
    "layers": "layers",
    "hidden": "hidden",
    "heads": "heads",
    "kv_heads": "kv_heads",
    "head_dim": "head_dim",
    "qk_rope_dim": "qk_rope_dim",
    "v_head_dim": "v_head_dim",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "ffn": "ffn",
    "vocab": "vocab",
    "experts": "experts",
    "top_k": "top_k",
    "shared_experts": "shared_experts",
    "gated": "gated",
    "moe_ffn": "moe_ffn",
}


class ModelSpec(BaseModel):
    """The shape of a decoder-only transformer, enough to count FLOPs, bytes and memory."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = "custom"
    """Display name."""
    layers: int = Field(gt=0)
    """Transformer blocks."""
    hidden: int = Field(gt=0)
    """Model width h."""
    heads: int = Field(gt=0)
    """Attention (query) heads."""
    kv_heads: int | None = Field(default=None, gt=0)
    """Key/value heads (grouped-query attention); default = heads."""
    head_dim: int = Field(default=0, ge=0)
    """Width of one attention head; 0 means hidden / heads. Models such as Qwen3 or gpt-oss
    set it apart from the width (their query projection is heads x head_dim wide). Under
    multi-head latent attention, the non-rotary part of each query/key head."""
    qk_rope_dim: int = Field(default=0, ge=0)
    """Multi-head latent attention: the rotary part of each query/key head, beside head_dim
    (DeepSeek's qk_rope_head_dim)."""
    v_head_dim: int = Field(default=0, ge=0)
    """Width of each value head; 0 means head_dim."""
    q_lora_rank: int = Field(default=0, ge=0)
    """Multi-head latent attention: rank of the query down-projection; 0: a full query."""
    kv_lora_rank: int = Field(default=0, ge=0)
    """Multi-head latent attention: rank of the joint key/value latent; 0: no MLA."""
    ffn: int | None = Field(default=None, gt=0)
    """MLP hidden size of a dense layer; default 4*hidden."""
    vocab: int = Field(default=51200, gt=0)
    """Vocabulary size (embedding and untied LM head)."""
    gated: bool = False
    """SwiGLU-style MLP with three matrices instead of two."""
    experts: int = Field(default=1, ge=1)
    """Routed experts per MoE layer; 1 means a dense model."""
    top_k: int = Field(default=1, ge=1)
    """Experts each token is routed to."""
    moe_ffn: int | None = Field(default=None, gt=0)
    """Hidden size of one expert's MLP; default = ffn."""
    shared_experts: int = Field(default=0, ge=0)
    """Always-active experts per MoE layer (DeepSeek style)."""
    source: str = ""
    """Where the shape was read."""

    @model_validator(mode="before")
    @classmethod
    def _default_head_dim(cls, values: object) -> object:
        if not isinstance(values, dict) or values.get("head_dim"):
            return values
        hidden, heads = values.get("hidden"), values.get("heads")
        if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
            if hidden % heads:
                raise ValueError(f"heads={heads} must divide hidden={hidden} (or give head_dim)")
            return {**values, "head_dim": hidden // heads}
        return values

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.heads % self.kv:
            raise ValueError(f"kv_heads={self.kv} must divide heads={self.heads}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}")
        if (self.qk_rope_dim or self.q_lora_rank) and not self.kv_lora_rank:
            raise ValueError("qk_rope_dim and q_lora_rank need kv_lora_rank (latent attention)")
        return self

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn or self.ffn_size

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): keys and values from a latent."""
        return self.kv_lora_rank > 0

    @property
    def qk_dim(self) -> int:
        """Width of one query/key head (its rotary part included under MLA)."""
        return self.head_dim + self.qk_rope_dim

    @property
    def v_dim(self) -> int:
        """Width of one value head."""
        return self.v_head_dim or self.head_dim

    @property
    def q_width(self) -> int:
        """Width of the queries (and of the query-key products): heads x query head."""
        return self.heads * self.qk_dim

    @property
    def o_width(self) -> int:
        """Width of the attention output (and of the probability-value products)."""
        return self.heads * self.v_dim

    @property
    def k_width(self) -> int:
        """Width of the keys attention reads: per key/value head, or per head under MLA."""
        return (self.heads if self.is_mla else self.kv) * self.qk_dim

    @property
    def v_width(self) -> int:
        """Width of the values attention reads."""
        return (self.heads if self.is_mla else self.kv) * self.v_dim

    def attention_gemms(self) -> list[tuple[int, int, str]]:
        """The projections of one layer's attention as (out, in, tp_split): `out` split
        over TP (column parallel), `in` (row parallel), or `none` (replicated: MLA's
        down-projections)."""
        h = self.hidden
        if not self.is_mla:
            return [(self.q_width + self.k_width + self.v_width, h, "out"), (h, self.o_width, "in")]
        rope, up = self.qk_rope_dim, self.heads * self.head_dim + self.o_width  # k and v up
        query = (
            [(self.q_lora_rank, h, "none"), (self.q_width, self.q_lora_rank, "out")]
            if self.q_lora_rank
            else [(self.q_width, h, "out")]
        )
        latent = [(self.kv_lora_rank + rope, h, "none"), (up, self.kv_lora_rank, "out")]
        return [*query, *latent, (h, self.o_width, "in")]

    @property
    def mlp_mats(self) -> int:
        return 3 if self.gated else 2

    def attn_params(self) -> int:
        """Q, K, V and output projection weights of one layer."""
        return sum(n * k for n, k, _ in self.attention_gemms())

    def mlp_params(self) -> int:
        """Weights of one layer's MLP: all experts (dense: the one MLP)."""
        if not self.is_moe:
            return self.mlp_mats * self.hidden * self.ffn_size
        one = self.mlp_mats * self.hidden * self.expert_ffn
        return one * (self.experts + self.shared_experts) + self.hidden * self.experts

    def active_mlp_params(self) -> int:
        """MLP weights one token passes through."""
        if not self.is_moe:
            return self.mlp_params()
        one = self.mlp_mats * self.hidden * self.expert_ffn
        return one * (self.top_k + self.shared_experts) + self.hidden * self.experts

    def layer_params(self) -> int:
        return self.attn_params() + self.mlp_params() + 2 * self.hidden

    def total_params(self) -> int:
        """All weights, with untied input embedding and LM head."""
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden

    def active_params(self) -> int:
        return (
            self.layers * (self.attn_params() + self.active_mlp_params())
            + 2 * self.vocab * self.hidden
        )

    def forward_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of one forward pass per token: matmuls, full (unmasked) attention
        scores, and the LM head; embeddings and elementwise ops are not counted."""
        attn_core = 2 * seq_len * (self.q_width + self.o_width)
        per_layer = 2 * (self.attn_params() + self.active_mlp_params()) + attn_core
        return self.layers * per_layer + 2 * self.vocab * self.hidden

    def describe(self) -> str:
        moe = f", {self.experts}x top-{self.top_k}" if self.is_moe else ""
        return f"{self.name} ({self.total_params() / 1e9:.1f}B{moe})"


class _PresetFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    models: dict[str, ModelSpec]


@cache
def presets() -> dict[str, ModelSpec]:
    """Built-in model presets by name."""
    loaded = validate(_PresetFile, load_yaml(PRESETS_PATH)).models
    return {key: spec.model_copy(update={"name": key}) for key, spec in loaded.items()}


def load_model(text: str) -> ModelSpec:
    """A model from a preset name, a HF config.json, a YAML file or inline `key=value,...`."""
    text = text.strip()
    if "=" in text:
        return parse_inline(text)
    path = Path(text)
    if text.endswith(".json") or (path.is_file() and path.suffix == ".json"):
        return from_hf_config(path)
    if text.endswith((".yaml", ".yml")):
        return validate(ModelSpec, load_yaml(path))
    key = text.lower()
    known = presets()
    if key not in known:
        raise UnknownNameError("model", text, known)
    return known[key]


def parse_inline(text: str) -> ModelSpec:
    """`layers=96,hidden=12288,heads=96,...` into a spec."""
    values: dict[str, object] = {"name": text}
    for part in text.split(","):
        key, sep, raw = part.strip().partition("=")
        if not sep or key not in INLINE_KEYS:
            raise ConfigError(
                f"'{part}' is not KEY=VALUE with KEY one of {', '.join(INLINE_KEYS)}", source=text
            )
        values[INLINE_KEYS[key]] = (
            raw.lower() in ("1", "true", "yes") if key == "gated" else _int(raw, key, text)
        )
    return _build(values, text)


def from_hf_config(path: Path) -> ModelSpec:
    """A spec from a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen, GPT-2 keys)."""
    try:
        cfg = json.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror}", source=str(path)) from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"malformed JSON: {err.msg}", source=str(path), line=err.lineno) from err

    def pick(*keys: str) -> object:
        return next((cfg[k] for k in keys if cfg.get(k) is not None), None)

    values = {
        "name": cfg.get("_name_or_path") or path.parent.name or path.stem,
        "layers": pick("num_hidden_layers", "n_layer", "num_layers"),
        "hidden": pick("hidden_size", "n_embd", "d_model"),
        "heads": pick("num_attention_heads", "n_head"),
        "kv_heads": pick("num_key_value_heads"),
        "head_dim": pick("qk_nope_head_dim", "head_dim"),
        "qk_rope_dim": pick("qk_rope_head_dim") if cfg.get("kv_lora_rank") else None,
        "v_head_dim": pick("v_head_dim"),
        "q_lora_rank": pick("q_lora_rank"),
        "kv_lora_rank": pick("kv_lora_rank"),
        "ffn": pick("intermediate_size", "n_inner", "ffn_dim"),
        "vocab": pick("vocab_size"),
        "gated": cfg.get("hidden_act", cfg.get("activation_function")) in ("silu", "swiglu"),
        "experts": pick("num_local_experts", "n_routed_experts", "num_experts") or 1,
        "top_k": pick("num_experts_per_tok") or 1,
        "moe_ffn": pick("moe_intermediate_size"),
        "shared_experts": pick("n_shared_experts") or 0,
    }
    for key in ("layers", "hidden", "heads"):
        if values[key] is None:
            raise ConfigError("no layer count, width or head count found", source=str(path))
    return _build({k: v for k, v in values.items() if v is not None}, str(path))


def _build(values: dict[str, object], source: str) -> ModelSpec:
    try:
        return ModelSpec.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise ConfigError(first["msg"], source=source, field=field) from err


def _int(raw: str, key: str, source: str) -> int:
    try:
        return int(float(raw.replace("_", "")))
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number", source=source, field=key) from None
