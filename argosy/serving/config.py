"""Engine configuration: which model, which engine, which speculation, how many threads,
and the share of the device's memory the service may use."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from argosy.serving.placement import PlacementError, parse_device, parse_dtype


class EngineConfig(BaseModel):
    """Settings one serving engine is built from."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model: str = "smollm2-135m"
    """A catalog name (`smollm2-135m`) or a local directory holding an HF checkpoint."""

    device: str = "auto"
    """`auto` (the first CUDA device when there is one, else the CPU), `cpu`, `cuda` or
    `cuda:N`: where the weights, the KV cache and the speculative paths live."""

    dtype: str = "auto"
    """`auto` (float32 on CPU; on a GPU the checkpoint's 16-bit dtype, bfloat16 for a
    float32 checkpoint), `bfloat16`, `float16` or `float32`."""

    engine: str = "transformers"
    """Engine name in the `ENGINES` registry."""

    speculative: str = "auto"
    """Proposer name in the `PROPOSERS` registry, or `off`; `auto` adapts per request."""

    num_speculative_tokens: int = Field(default=8, ge=1, le=32)
    """Most tokens a proposer drafts for one verify pass."""

    max_batch_size: int = Field(default=32, ge=1, le=256)
    """Most requests decoded together; more wait in the queue."""

    num_threads: int = Field(default=0, ge=0)
    """torch intra-op threads; 0 keeps torch's default."""

    cache_dir: str | None = None
    """Where converted checkpoints are cached; None means `$ARGOSY_CACHE_DIR` or ~/.cache/argosy."""

    max_context_tokens: int = Field(default=0, ge=0)
    """Prompt plus completion limit; 0 takes the model's own position limit."""

    memory_fraction: float | None = Field(default=None, gt=0, le=1)
    """Share of the device's memory this service owns (0 < F <= 1): the weights, a 10%
    activation reserve and the KV caches must fit in F x the device's memory, and requests
    wait for KV room (docs/serving.md, "Several services on one device"); None: no budget."""

    prefix_cache_tokens: int = Field(default=8192, ge=0)
    """Prompt positions the prefix cache may hold (KV shared across requests whose prompts
    start alike; each costs `kv_bytes_per_token`); 0 turns the cache off. With a memory
    fraction it takes at most a quarter of the KV budget, and admission counts it."""

    prefix_block_tokens: int = Field(default=32, ge=1)
    """Granularity of the prefix cache: prompts share cached KV in whole blocks."""

    prefill_chunk_tokens: int = Field(default=512, ge=0)
    """Most prompt tokens one prefill chunk feeds; chunks run between decode steps of the
    running streams. 0 prefills each prompt whole (at admission, without a prefix cache)."""

    prefill_stall_ratio: float = Field(default=1.0, ge=0)
    """While streams decode, a chunk is cut to about this times a decode step's measured
    time (at least 16 tokens); 0: chunks are always `prefill_chunk_tokens`."""

    device_memory_bytes: int = Field(default=0, ge=0)
    """Memory of the device `memory_fraction` applies to; 0 detects it (the GPU's total
    memory, or the host's MemTotal for an engine computing on CPU)."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        try:
            return parse_device(value)
        except PlacementError as err:
            raise ValueError(str(err)) from None

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        try:
            return parse_dtype(value)
        except PlacementError as err:
            raise ValueError(str(err)) from None
