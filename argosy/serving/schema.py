"""OpenAI-compatible request bodies, validated: a bad field is a 4xx that names it.

Only the fields argosy honours are accepted (unknown fields are rejected, so a typo such as
`max_token` is an error rather than a silently ignored knob).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from argosy.serving.types import SamplingParams


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    """A last chunk before `[DONE]` carries the request's token usage (and no choices)."""


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    """Served model name, as `/v1/models` lists it."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens to generate; None means 64."""
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """0 is greedy; higher spreads the distribution."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    seed: int | None = None
    """Seed for reproducible sampling."""
    stream: bool = False
    """Server-sent events, one chunk per engine step, then `data: [DONE]`."""
    stream_options: StreamOptions | None = None
    """With `stream`: `include_usage` adds a usage chunk at the end."""
    stop: str | list[str] | None = None
    """Strings that end the generation (not included in the output)."""
    n: Literal[1] = 1
    """Number of choices; only 1 is served."""
    user: str | None = None
    """Caller identifier (accepted, unused)."""
    speculative: str | None = None
    """argosy extension: proposer for this request (`off`, `ngram`, `auto`)."""

    def sampling(self, default_max_tokens: int = 64) -> SamplingParams:
        """The engine's sampling parameters."""
        return SamplingParams(
            max_tokens=self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
        )

    def stop_strings(self) -> list[str]:
        """`stop` as a list (empty strings dropped)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class CompletionBody(_Sampling):
    """`POST /v1/completions`."""

    prompt: str = Field(min_length=1)
    """Text to continue."""


class ChatMessage(BaseModel):
    """One chat turn."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    """Who speaks."""
    content: str
    """What is said."""


class ChatBody(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    """The conversation so far."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Newer name of `max_tokens`; wins when both are given."""

    def sampling(self, default_max_tokens: int = 64) -> SamplingParams:
        """As for completions, honouring `max_completion_tokens`."""
        params = super().sampling(default_max_tokens)
        if self.max_completion_tokens is None:
            return params
        return SamplingParams(
            max_tokens=self.max_completion_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
        )
