"""Value types shared by engines, proposers and the API: requests, chunks, results, stats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens; temperature 0 is greedy (and deterministic)."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token generated so far."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was generated so far."""
    logprobs: int | None = None
    """None: no log-probabilities; k >= 0: each chosen token's and its k most likely
    alternatives' (the model's own log-softmax, before temperature and penalties)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        """True when the argmax is taken at every position."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """True when presence or frequency penalties change the logits."""
        return bool(self.presence_penalty or self.frequency_penalty)


@dataclass(frozen=True)
class GenerationRequest:
    """Token ids in, with sampling settings and an optional speculation override."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    speculative: str | None = None
    """Proposer name for this request; None takes the engine's configured one."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and its most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    """(token text, log-probability) of the k most likely tokens, most likely first."""
    token: str = ""
    """The token's text (its bytes decoded; an incomplete character shows as U+FFFD)."""
    token_bytes: bytes = b""
    """The token's exact bytes."""


@dataclass(frozen=True)
class GenerationChunk:
    """Tokens produced by one engine step; `finish_reason` is set on the last chunk."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    """One entry per token of `token_ids` when the request asked for log-probabilities."""


@dataclass
class SpecCounters:
    """What speculation did for one request (or summed over many)."""

    verify_passes: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, other: SpecCounters) -> None:
        """Accumulate another request's counters."""
        self.verify_passes += other.verify_passes
        self.plain_steps += other.plain_steps
        self.drafted += other.drafted
        self.accepted += other.accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class GenerationResult:
    """A finished generation, with the figures the API and /metrics report."""

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    finish_reason: str
    ttft_s: float
    total_s: float
    spec: SpecCounters

    @property
    def completion_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)


@dataclass
class EngineStats:
    """Engine-wide counters since load; `asleep` and `resident_bytes` describe memory."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spec: SpecCounters = field(default_factory=SpecCounters)
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    asleep: bool = False
    last_wake_s: float | None = None
    running: int = 0
    """Requests being decoded now."""
    waiting: int = 0
    """Requests queued for admission (the queue depth)."""
    batched_steps: int = 0
    """Decode steps that ran several requests in one forward pass."""
    batched_tokens: int = 0
    """Tokens those batched steps produced."""
    budget: dict[str, float] = field(default_factory=dict)
    """The memory budget (`MemoryBudget.as_dict`) when the engine has a memory fraction."""
    kv_reserved_tokens: int = 0
    """Cached positions the running requests may reach (counted against the budget)."""
    prefix_cache: dict[str, int] = field(default_factory=dict)
    """The prefix cache's counters and size (`PrefixCacheStats` plus `cached_tokens`,
    `capacity_tokens`); empty when it is off."""
    prefill_chunks: int = 0
    """Prefill chunks run (staged prefill)."""
