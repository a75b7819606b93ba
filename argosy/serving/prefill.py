"""Staged prefill: one request's prompt computed in chunks, on top of a cached prefix.

The batch loop (`batching.BatchLoop`) holds admitted requests whose prompt is not yet in
their cache as `PrefillJob`s and runs one chunk of the oldest per loop iteration, between
the decode steps of the running streams, so a long prompt never stalls them for its
whole prefill. A job:
1. starts from the prefix cache (`prefix_cache.PrefixCache.match`): the request's cache is
   seeded with the longest cached block-aligned prefix, and only the rest is fed;
2. feeds the rest in chunks of `ChunkSizer.size` tokens (the decoder's own forward: the
   cache grows by each chunk, positions follow from its length);
3. after the last chunk, stores the prompt's full blocks in the prefix cache and picks the
   first token from the last position's logits.

`ChunkSizer` is the pure decision: at most `chunk_tokens` per chunk (0: the whole rest),
and while streams are decoding, no more than `stall_ratio` x the measured decode step
time's worth of tokens at the measured prefill seconds per token (at least `min_tokens`,
and `min_tokens` until both are measured), so a stream's inter-token time stays within
about (1 + stall_ratio) x its plain step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from argosy.serving.decoding import Decoder
from argosy.serving.prefix_cache import PrefixCache

_DECAY = 0.7
"""Weight of the old estimate in the moving averages of step and per-token times."""


class ChunkSizer:
    """How many prompt tokens the next prefill chunk feeds.

    While streams decode, a chunk may add about `stall_ratio` decode steps of work beyond
    what any pass costs: its seconds are fitted as fixed + per token x tokens (weighted
    least squares over recent chunks; on a launch-bound GPU the fixed part is most of a
    pass, on a CPU the per-token part). Until chunks of different sizes were seen, the
    fixed part is taken as zero."""

    def __init__(self, chunk_tokens: int = 512, stall_ratio: float = 1.0, min_tokens: int = 16):
        self.chunk_tokens = chunk_tokens
        self.stall_ratio = stall_ratio
        self.min_tokens = min_tokens
        self.step_s: float | None = None
        """Moving average of a decode step's seconds."""
        self._fit = _AffineFit()

    @property
    def token_s(self) -> float | None:
        """Seconds each further prompt token adds to a chunk (None: nothing measured)."""
        return self._fit.slope()

    def size(self, remaining: int, decoding: bool) -> int:
        """Tokens of the next chunk, given the prompt tokens left and whether streams run."""
        size = self.chunk_tokens or remaining
        if decoding and self.stall_ratio and self.chunk_tokens:
            token_s = self.token_s
            if token_s is None or self.step_s is None:  # a probe: nothing measured yet
                size = self.min_tokens
            elif token_s > 0:
                fair = int(self.stall_ratio * self.step_s / token_s)
                size = min(size, max(self.min_tokens, fair))
        return max(1, min(size, remaining))

    def observe_step(self, seconds: float) -> None:
        """Learn a decode step's time."""
        self.step_s = _average(self.step_s, seconds)

    def observe_chunk(self, num_tokens: int, seconds: float) -> None:
        """Learn a prefill pass's time for `num_tokens` tokens."""
        self._fit.add(max(1, num_tokens), seconds)


class _AffineFit:
    """Seconds = fixed + slope x tokens, by least squares weighted towards recent passes."""

    def __init__(self) -> None:
        self.w = self.n = self.t = self.nn = self.nt = 0.0

    def add(self, tokens: float, seconds: float) -> None:
        keep = _DECAY if self.w else 0.0
        self.w = keep * self.w + 1.0
        self.n = keep * self.n + tokens
        self.t = keep * self.t + seconds
        self.nn = keep * self.nn + tokens * tokens
        self.nt = keep * self.nt + tokens * seconds

    def slope(self) -> float | None:
        if not self.w:
            return None
        mean_n, mean_t = self.n / self.w, self.t / self.w
        var = self.nn / self.w - mean_n * mean_n
        if var <= (0.1 * mean_n) ** 2:  # one size seen: no fixed part can be told apart
            return mean_t / mean_n
        return (self.nt / self.w - mean_n * mean_t) / var


class PrefillJob:
    """One admitted request's prompt, computed chunk by chunk."""

    def __init__(self, slot: Any) -> None:
        self.slot = slot
        """The batch loop's `Slot` (its decoder, its output queue)."""
        self.position = 0
        """Prompt positions in the decoder's cache so far."""
        self.reused = 0
        """Of those, the positions the prefix cache gave (the rest were computed here)."""
        self.started = False

    @property
    def decoder(self) -> Decoder:
        """The request's decoder."""
        decoder: Decoder = self.slot.decoder
        return decoder

    @property
    def remaining(self) -> int:
        """Prompt tokens not yet in the cache."""
        return len(self.decoder.tokens) - self.position

    def start(self, prefix_cache: PrefixCache | None, make_cache: Callable[..., Any]) -> int:
        """Seed the request's cache with the longest cached prefix; the positions reused."""
        self.started = True
        if prefix_cache is None:
            return 0
        reused, layers = prefix_cache.match(self.decoder.tokens)
        if reused:
            self.decoder.cache = make_cache(layers)
            self.position = self.reused = reused
        return reused

    def feed(self, num_tokens: int) -> torch.Tensor | None:
        """Feed the next `num_tokens` prompt tokens; the last position's logits once the
        whole prompt is in (else None)."""
        decoder, end = self.decoder, self.position + num_tokens
        logits = decoder.forward(decoder.tokens[self.position : end], decoder.cache, 1)
        self.position = end
        return logits[-1:] if self.remaining == 0 else None

    def store(self, prefix_cache: PrefixCache | None) -> None:
        """Offer the prompt's full blocks to the prefix cache."""
        if prefix_cache is not None:
            layers = [(layer.keys, layer.values) for layer in self.decoder.cache.layers]
            prefix_cache.insert(self.decoder.tokens, layers)


def _average(old: float | None, new: float) -> float:
    return new if old is None else _DECAY * old + (1 - _DECAY) * new
