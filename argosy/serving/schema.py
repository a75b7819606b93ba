"""OpenAI-compatible request bodies, validated: a bad field is a 4xx that names it.

Only the fields argosy honours (or accepts with a documented meaning) are taken; unknown
fields are rejected, so a typo such as `max_token` is an error rather than a silently
ignored knob. What each field does is in docs/serving.md ("API").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from argosy.serving.types import SamplingParams

MAX_N = 16
"""Most choices one request may ask for (`n`, times the prompts of a list)."""
MAX_TOP_LOGPROBS = 20
"""Most alternatives per token (`top_logprobs`, `logprobs`), as OpenAI."""
COMPLETION_MAX_TOKENS = 64
"""`max_tokens` of a completion that gives none."""


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
    """Most tokens to generate per choice; None: 64 for a completion, the rest of the
    context for a chat."""
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """0 is greedy; higher spreads the distribution."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    """Seed for reproducible sampling (the same tokens whatever the speculation)."""
    stream: bool = False
    """Server-sent events, one chunk per engine step, then `data: [DONE]`."""
    stream_options: StreamOptions | None = None
    """With `stream`: `include_usage` adds a usage chunk at the end."""
    stop: str | list[str] | None = Field(default=None)
    """Strings that end the generation (not included in the output); at most 4."""
    n: int = Field(default=1, ge=1, le=MAX_N)
    """Number of choices, decoded as parallel sequences of the same prompt."""
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    """Subtracted from the logit of every token already generated."""
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    """Subtracted from a token's logit once per time it was generated."""
    user: str | None = None
    """Caller identifier (accepted, unused)."""
    speculative: str | None = None
    """argosy extension: proposer for this request (`off`, `ngram`, `auto`, ...)."""

    @model_validator(mode="after")
    def _few_stops(self) -> _Sampling:
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 stop strings")
        return self

    def sampling(self, max_tokens: int, top_logprobs: int | None = None) -> SamplingParams:
        """The engine's sampling parameters for one choice."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=top_logprobs,
        )

    def stop_strings(self) -> list[str]:
        """`stop` as a list (empty strings dropped)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionBody(_Sampling):
    """`POST /v1/completions`."""

    prompt: Prompt
    """Text, a list of texts, token ids, or a list of token-id lists (one choice set each)."""
    echo: bool = False
    """Each choice's text starts with its prompt."""
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Log-probabilities of the chosen tokens and this many alternatives per token."""

    @model_validator(mode="after")
    def _prompts(self) -> CompletionBody:
        prompts = self.prompts()
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompt: must not be empty")
        if len(prompts) * self.n > MAX_N:
            raise ValueError(f"prompt: {len(prompts)} prompts x n {self.n} exceeds {MAX_N}")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each text or token ids."""
        prompt: Any = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        return list(prompt)

    def max_tokens_for(self, prompt_tokens: int, context: int) -> int:
        """`max_tokens`, else 64 (capped by what the context leaves, at least 1)."""
        return self.max_tokens or max(1, min(COMPLETION_MAX_TOKENS, context - prompt_tokens))


class TextPart(BaseModel):
    """One part of a message's content (only text is served)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    """Only `text`: this model reads no images or audio."""
    text: str
    """The text."""


class ChatMessage(BaseModel):
    """One chat turn."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    """Who speaks; `developer` is read as `system`."""
    content: str | list[TextPart] | None = None
    """What is said: text, or a list of text parts (joined); None for an assistant turn
    that only called tools."""
    name: str | None = None
    """The speaker's name (accepted; the chat template does not show it)."""
    tool_calls: list[dict[str, Any]] | None = None
    """An assistant turn's tool calls, passed to the chat template."""
    tool_call_id: str | None = None
    """A tool turn's call id, passed to the chat template."""

    def text(self) -> str:
        """The content as one string."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template takes it."""
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.text()}
        if self.tool_calls is not None:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    """`text`; `json_object` (the prompt must mention JSON); `json_schema` is refused."""


class FunctionSpec(BaseModel):
    """A tool's function."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    """The function's name."""


class Tool(BaseModel):
    """One entry of `tools`."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    """Only functions."""
    function: FunctionSpec
    """The function the model may call."""


class ChatBody(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    """The conversation so far."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Newer name of `max_tokens`; wins when both are given."""
    logprobs: bool = False
    """Log-probabilities of the chosen tokens."""
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """With `logprobs`: this many alternatives per token."""
    response_format: ResponseFormat | None = None
    """`text` or `json_object` (see docs/serving.md for what is enforced)."""
    tools: list[Tool] | None = None
    """Tools, passed to the chat template; the reply is text (no tool calls are parsed)."""
    tool_choice: Literal["none", "auto"] | dict[str, Any] | None = None
    """`none` or `auto` (the model answers in text); a forced call is refused."""
    parallel_tool_calls: bool | None = None
    """Accepted; no tool calls are parsed."""

    @model_validator(mode="after")
    def _consistent(self) -> ChatBody:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs true")
        if isinstance(self.tool_choice, dict):
            raise ValueError("tool_choice: a forced tool call is not served; use none or auto")
        return self

    def top_count(self) -> int | None:
        """Alternatives per token when logprobs are asked for, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def max_tokens_for(self, prompt_tokens: int, context: int) -> int:
        """`max_completion_tokens`, `max_tokens`, else what the context leaves."""
        given = self.max_completion_tokens or self.max_tokens
        return given or max(1, context - prompt_tokens)

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them."""
        return [m.for_template() for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """`tools` for the chat template (None without tools or with `tool_choice` none)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump() for t in self.tools]

    def prompt_chars(self) -> int:
        """Characters of every message's text."""
        return sum(len(m.text()) for m in self.messages)
