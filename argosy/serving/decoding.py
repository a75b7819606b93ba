"""The decode loop: prefill, then plain steps or draft-and-verify steps, losslessly.

Model-agnostic: it calls `forward(token_ids, cache, num_logits) -> logits[num_logits, vocab]`
(the last positions only) and appends the tokens to the KV cache, and `crop(cache, n)`,
which drops the last n cached positions.
A verify step feeds the last token plus the draft in one pass and keeps the longest draft
prefix the target agrees with, plus the target's own next token:
- greedy: a draft token is kept iff it is the argmax, so the output is token-for-token the
  output of plain greedy decoding;
- sampling: the token at generated position g is drawn from the target's p by inverse
  transform with a uniform number that depends only on (seed, g); a draft token d is kept
  iff that draw is d, else the draw replaces it. So d is kept with probability p(d) and a
  rejection gives a token from p without d (the speculative-sampling rule for a
  deterministic draft): every token is distributed as p, and since the draw at g does not
  depend on the draft, a seeded request gives the same tokens under every proposer.

Presence and frequency penalties are subtracted from the logits before either rule (from
each row's own prefix: the tokens generated so far plus the draft tokens before it), so
speculation stays lossless under them. With `params.logprobs` set, every emitted token's
log-probability (the model's log-softmax, before temperature and penalties) and its top
alternatives are appended to `logprobs`, one entry per token.

In a batch the loop owns the forward pass and the cache: it asks each request for its
draft (`offer`), runs one batched pass, and hands each request its rows of logits
(`check`, the same acceptance rule); the request only decides tokens.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from argosy.serving.speculative.base import (
    NEW_ROW_ACCEPTANCE,
    DraftOffer,
    ObservesSteps,
    OffersDrafts,
    Proposer,
    StepRecord,
)
from argosy.serving.speculative.costs import AcceptanceTracker, StepCosts
from argosy.serving.types import SamplingParams, SpecCounters

Forward = Callable[[Sequence[int], Any, int], torch.Tensor]
Crop = Callable[[Any, int], None]


class Decoder:
    """Iterates over (new_tokens, finish_reason) for one request."""

    def __init__(
        self,
        forward: Forward,
        crop: Crop,
        cache: Any,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        eos_ids: frozenset[int],
        proposer: Proposer | None = None,
        costs: StepCosts | None = None,
        acceptance: AcceptanceTracker | None = None,
        proposer_key: str = "",
    ) -> None:
        self.forward, self.crop, self.cache = forward, crop, cache
        self.tokens = list(prompt_ids)
        self.params = params
        self.eos_ids = eos_ids
        self.proposer = proposer
        self.costs = costs if costs is not None else StepCosts()
        self.acceptance = acceptance
        """The engine's running acceptance per proposer, taught by every verify pass."""
        self.proposer_key = proposer_key
        self.counters = SpecCounters()
        self.num_generated = 0
        self.stopped = False
        self.seed = params.seed if params.seed is not None else random.getrandbits(63)
        self.counts: Counter[int] = Counter()
        """How often each generated token was generated (the penalties count these)."""
        self.logprobs: list[tuple[int, float, tuple[tuple[int, float], ...]]] = []
        """(token, log-probability, top alternatives) of every emitted token, when asked."""
        self._rows: torch.Tensor | None = None  # the logits rows of the tokens deciding now

    def __iter__(self) -> Iterator[tuple[list[int], str | None]]:
        yield self.prefill()
        while not self.finished:
            yield self.advance()

    def prefill(self) -> tuple[list[int], str | None]:
        """The whole prompt in one pass; gives the first token."""
        logits = self.forward(self.tokens, self.cache, 1)
        return self._emit([self.pick(logits[-1:])])

    def first(self, logits: torch.Tensor) -> tuple[list[int], str | None]:
        """The first token from prefill logits that a batched pass computed (cache filled)."""
        return self._emit([self.pick(logits)])

    def advance(self) -> tuple[list[int], str | None]:
        """One plain or draft-and-verify step on this request's own cache."""
        return self._emit(self._step())

    def take(self, logits: torch.Tensor) -> tuple[list[int], str | None]:
        """One plain step whose logits (one row) a batched forward pass computed."""
        self.counters.plain_steps += 1
        return self._emit([self.pick(logits)])

    def offer(self) -> DraftOffer:
        """This request's draft for a batched verify pass (empty: decode plainly)."""
        room = self.params.max_tokens - self.num_generated - 1
        if self.proposer is None or room < 1:
            return DraftOffer()
        if isinstance(self.proposer, OffersDrafts):
            offer = self.proposer.offer(self.tokens, room)
            return DraftOffer(offer.tokens[:room], offer.acceptance, offer.adaptive)
        draft = tuple(self.proposer.propose(self.tokens, room)[:room])
        return DraftOffer(draft, self._acceptance_estimate(), adaptive=True)

    def _acceptance_estimate(self) -> float:
        """A fixed proposer's per-token acceptance so far: this request's accepted over
        drafted tokens, from a prior worth two drafted tokens (the engine's running
        acceptance of this proposer, else 0.5; at most `NEW_ROW_ACCEPTANCE` before this request
        drafted). With it the batch policy sizes a fixed
        proposer's draft like an adaptive one's: long while a wider pass is cheap, none
        once the batch is full enough that verifying costs more than it yields."""
        prior = self.acceptance.acceptance(self.proposer_key) if self.acceptance else None
        prior = 0.5 if prior is None else prior
        if not self.counters.drafted:  # the other requests' acceptance: claim little
            return min(prior, NEW_ROW_ACCEPTANCE)
        return (self.counters.accepted + 2 * prior) / (self.counters.drafted + 2)

    def check(
        self,
        draft: Sequence[int],
        logits: torch.Tensor,
        elapsed_s: float,
        argmax: Sequence[int] | None = None,
    ) -> tuple[tuple[list[int], str | None], int]:
        """Verify `draft` against the logits a batched pass computed for [last, *draft]
        (one row per position); returns the step and how many draft tokens were kept.
        `argmax`: the rows' argmax when the batch already took it (one device sync per
        batch rather than one per request)."""
        new = self._accept(list(draft), logits, argmax)
        accepted = len(new) - 1
        self._record(len(draft), accepted, elapsed_s, solo=False)
        return self._emit(new), accepted

    @property
    def finished(self) -> bool:
        """A stop token was produced or max_tokens reached."""
        return self.stopped or self.num_generated >= self.params.max_tokens

    def _step(self) -> list[int]:
        remaining = self.params.max_tokens - self.num_generated
        draft: list[int] = []
        start = time.perf_counter()  # a draft model's time counts in the step's cost
        if self.proposer is not None and remaining > 1:
            draft = self.proposer.propose(self.tokens, remaining - 1)[: remaining - 1]
        # the cache holds every token but the last; feed the last plus the draft
        logits = self.forward([self.tokens[-1], *draft], self.cache, len(draft) + 1)
        new = self._accept(draft, logits)
        accepted = len(new) - 1
        self.crop(self.cache, len(draft) - accepted)
        self._record(len(draft), accepted, time.perf_counter() - start)
        return new

    def _accept(
        self, draft: list[int], logits: torch.Tensor, argmax: Sequence[int] | None = None
    ) -> list[int]:
        self._rows = logits
        if self.params.penalized:
            logits, argmax = self._penalize(logits, draft), None
        if self.params.greedy:
            preds = list(argmax) if argmax is not None else logits.argmax(dim=-1).tolist()
            kept = 0
            while kept < len(draft) and draft[kept] == preds[kept]:
                kept += 1
            return [*draft[:kept], preds[kept]]
        probs = _probs(logits, self.params).cpu()  # the draws happen on the CPU
        out: list[int] = []
        for i in range(len(draft) + 1):
            token = self._draw(probs[i], self.num_generated + i)
            out.append(token)
            if i == len(draft) or token != draft[i]:
                break
        return out

    def pick(self, logits: torch.Tensor) -> int:
        """The next token from the last row of `logits` (argmax, or sampled)."""
        row = logits[-1:]
        self._rows = row
        if self.params.penalized:
            row = self._penalize(row, [])
        if self.params.greedy:
            return int(row[-1].argmax().item())
        probs = _probs(row, self.params)[0].cpu()
        return self._draw(probs, self.num_generated)

    def _draw(self, probs: torch.Tensor, position: int) -> int:
        """Inverse-transform draw from `probs` with the uniform of (seed, position)."""
        u = random.Random(f"{self.seed}:{position}").random()
        cdf = probs.double().cumsum(0)
        index = int(torch.searchsorted(cdf, u * float(cdf[-1]), right=True).item())
        return min(index, probs.shape[0] - 1)

    def _penalize(self, logits: torch.Tensor, draft: Sequence[int]) -> torch.Tensor:
        """Logits less the presence and frequency penalties of each row's own prefix."""
        out = logits.float().clone()
        counts = Counter(self.counts)
        presence, frequency = self.params.presence_penalty, self.params.frequency_penalty
        for j in range(out.shape[0]):
            if j:
                counts[draft[j - 1]] += 1
            if counts:
                ids = torch.tensor(list(counts), device=out.device)
                times = torch.tensor(list(counts.values()), dtype=out.dtype, device=out.device)
                out[j, ids] -= presence + frequency * times
        return out

    def _record(self, drafted: int, accepted: int, elapsed_s: float, solo: bool = True) -> None:
        """Count the step; a solo step also teaches the engine-wide batch-1 costs."""
        if drafted:
            self.counters.verify_passes += 1
            self.counters.drafted += drafted
            self.counters.accepted += accepted
            if self.acceptance is not None:
                self.acceptance.observe(self.proposer_key, drafted, accepted)
        else:
            self.counters.plain_steps += 1
        if solo:
            self.costs.observe(drafted, elapsed_s)
        if isinstance(self.proposer, ObservesSteps):
            cost = self.costs.draft_token_cost
            self.proposer.observe(StepRecord(drafted, accepted, elapsed_s, cost))

    def _emit(self, new: list[int]) -> tuple[list[int], str | None]:
        room = self.params.max_tokens - self.num_generated
        new = new[:room]
        for i, token in enumerate(new):
            if token in self.eos_ids:
                self._extend(new[:i])
                self.stopped = True
                return new[:i], "stop"
        self._extend(new)
        return new, ("length" if self.num_generated >= self.params.max_tokens else None)

    def _extend(self, new: list[int]) -> None:
        if self.params.logprobs is not None and new and self._rows is not None:
            self.logprobs.extend(_logprobs(self._rows[: len(new)], new, self.params.logprobs))
        self.tokens.extend(new)
        self.num_generated += len(new)
        self.counts.update(new)
        self._rows = None


def _logprobs(
    rows: torch.Tensor, tokens: Sequence[int], top: int
) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
    """Each token's log-probability under its row and the row's `top` most likely tokens."""
    logp = torch.log_softmax(rows.float(), dim=-1).cpu()
    chosen = logp[torch.arange(len(tokens)), torch.tensor(list(tokens))].tolist()
    if top:
        values, ids = logp.topk(top, dim=-1)
        alts = [
            tuple(zip(i, v, strict=True))
            for i, v in zip(ids.tolist(), values.tolist(), strict=True)
        ]
    else:
        alts = [()] * len(tokens)
    return [(t, lp, alt) for t, lp, alt in zip(tokens, chosen, alts, strict=True)]


def _probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature- and top-p-warped probabilities, one row per position."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs > params.top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    warped = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return warped / warped.sum(dim=-1, keepdim=True)
