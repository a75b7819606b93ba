"""Config section of the planner."""

from pydantic import BaseModel, ConfigDict, Field


class PlannerConfig(BaseModel):
    """Defaults of `argosy plan` and `argosy estimate`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    default_model: str = "llama3-8b"
    """Model preset, HF config.json, YAML file or inline shape used when --model is not given."""
    seq_len: int = Field(default=8192, gt=0)
    """Sequence length (tokens) when --seq-len is not given."""
    global_batch: int = Field(default=512, gt=0)
    """Sequences per optimizer step when --global-batch is not given."""
    top_k: int = Field(default=5, gt=0)
    """Plans shown by `argosy plan` when --top is not given."""
