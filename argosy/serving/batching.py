"""Continuous batching: one scheduler loop admits requests between decode steps.

Each request is a `Decoder` (its tokens, sampling state and KV cache). The loop, on its own
thread, repeats:
1. admit waiting requests (up to `max_batch_size` running): the newcomers' prompts are
   prefilled in one left-padded pass (one alone when it comes alone; identical prompts,
   such as the `n` choices of one request, computed once and their cache copied), which
   gives their first tokens at once (time to first token does not wait for a batch to end);
2. drop finished and cancelled requests;
3. decode one step for everyone: with one request running it takes that request's own
   step, speculative drafts included; with several, each request offers a draft (its own
   proposer's, possibly empty), the `DraftPolicy` (by default `BatchDraftPolicy`: expected
   tokens per second from the rows' acceptance and the measured cost of a wider pass at
   this batch size) decides how many tokens the adaptive offers may verify, and one
   batched forward pass verifies every row's last token plus its draft (right-padded to
   the longest). Each request then keeps its own
   accepted prefix (the decoder's lossless rule). A row whose own callback raises (its
   proposer's offer, its verification) fails alone; the other rows take their step.

The batched KV cache is left-padded: row i holds its `lengths[i]` cached positions, the
attention mask hides padding and `position_ids` give each row its own positions. After a
verify pass a row's rejected draft positions stay in the cache but are masked out (a hole
is exactly like padding); once holes waste more than a quarter of the width, the cache is
compacted (one gather per layer, rows left-padded to the longest again). The batched cache
is built when two or more requests run; a newcomer joins it by one left-padded
concatenation per layer, a request that leaves is removed with `batch_select_indices`, and
it is split back into a request's own cache only when one request remains. None of these
touches the running rows one by one: on a GPU a decode step is launch-bound, and work per
row and layer would cost more than the step.
Every request's output is exactly what it would be alone, up to floating-point summation
order.

With a KV capacity (`kv_capacity_tokens`, from the service's memory budget,
`budget.MemoryBudget`) a request is admitted only while the running rows plus it fit:
each row may grow to its prompt plus `max_tokens` plus one draft, and the batched cache
pads every row to the longest (`budget.kv_tokens_needed`). The first request that does
not fit waits at the head of the queue (first come, first served) until rows finish; one
that could not fit even alone fails with a `ValueError` (the engine refuses it earlier).

Staged prefill (`prefill.py`; on with a `prefix_cache` or a `chunks` sizer): newcomers are
not prefilled at admission but queued as prefill jobs, counted against the batch size and
the KV capacity at once. Each loop iteration, before the running rows' decode step, runs
either one pass over the oldest jobs whose whole remaining prompt fits the chunk budget
together (each on top of its longest cached prefix; identical prompts computed once; the
pass stores their full blocks in the prefix cache), or else one chunk of the oldest job. A
job whose prompt is in joins the rows with its first token.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from argosy.serving import kv_batch
from argosy.serving.budget import kv_tokens_needed
from argosy.serving.decoding import Decoder
from argosy.serving.kv_batch import KVRows
from argosy.serving.prefill import ChunkSizer, PrefillJob
from argosy.serving.prefix_cache import PrefixCache
from argosy.serving.speculative.base import DraftOffer
from argosy.serving.speculative.batch_policy import BatchDraftPolicy

BatchedForward = Callable[[torch.Tensor, Any, torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(input_ids [B, L], cache, attention_mask [B, T+L], position_ids [B, L], num_logits)
-> logits of the last `num_logits` positions, [B, num_logits, V]."""


class DraftPolicy(Protocol):
    """Decides how many draft tokens adaptive rows verify, and learns what passes cost."""

    def width(self, offers: Sequence[DraftOffer]) -> int:
        """The draft width for a step, given every row's offer."""
        ...

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Learn from a batched pass that fed `num_tokens` tokens."""
        ...


_MIN_WASTE = 16
"""Masked-out cache positions tolerated before the batched cache is compacted."""
_GROUP_TOKENS = 4096
"""Most prompt tokens (padding included) one batched prefill pass of several jobs feeds."""


Step = tuple[list[int], str | None]


class Slot:
    """One request in the loop: its decoder and the queue its steps are delivered to."""

    def __init__(self, decoder: Decoder, max_length: int = 0) -> None:
        self.decoder = decoder
        self.max_length = max_length
        """The most cached positions this request may reach (prompt, completion, a draft)."""
        self.out: queue.Queue[Step | BaseException] = queue.Queue()
        self.cancelled = False
        self.done = False

    def chunks(self) -> Iterator[Step]:
        """The request's steps as the loop decides them; closing cancels the request."""
        try:
            while True:
                item = self.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item[1] is not None:
                    return
        finally:
            self.cancelled = True


class BatchLoop:
    """Runs every admitted request's decode steps, batching them when several run."""

    def __init__(
        self,
        batched_forward: BatchedForward,
        make_cache: Callable[..., Any],
        max_batch_size: int,
        policy: DraftPolicy | None = None,
        kv_capacity_tokens: int = 0,
        max_draft_tokens: int = 8,
        prefix_cache: PrefixCache | None = None,
        chunks: ChunkSizer | None = None,
    ) -> None:
        self.batched_forward = batched_forward
        self.make_cache = make_cache
        self.max_batch_size = max_batch_size
        self.kv_capacity_tokens = kv_capacity_tokens
        """Cached positions the KV budget holds; 0: no limit."""
        self.max_draft_tokens = max_draft_tokens
        self._held: Slot | None = None  # the queue's head, waiting for KV room
        self.policy = policy if policy is not None else BatchDraftPolicy()
        self.waiting: queue.Queue[Slot] = queue.Queue()
        self.rows: list[Slot] = []
        self.batch_steps = 0
        self.batched_tokens = 0
        self.solo_steps = 0
        """Decode steps of a request running alone (its own draft-and-verify step)."""
        self.fed_tokens = 0
        """Tokens fed to batched decode passes (rows x (1 + draft width), padding included)."""
        self.verify_steps = 0
        self.compactions = 0
        self.prefilled_rows = 0
        """Prompt rows computed by joint prefills (identical prompts count once)."""
        self.prefix_cache = prefix_cache
        staged = prefix_cache is not None or chunks is not None
        self.chunks = chunks if chunks is not None or not staged else ChunkSizer(0)
        """Staged prefill's chunk sizes; None: newcomers are prefilled at admission."""
        self._prefilling: list[PrefillJob] = []
        self.prefill_chunks = 0
        """Chunks run by staged prefill."""
        self._batch: KVRows | None = None
        """The running rows' batched cache while two or more run (in `rows` order)."""
        self._thread = threading.Thread(target=self._run, name="argosy-batch-loop", daemon=True)
        self._thread.start()

    def submit(self, decoder: Decoder) -> Slot:
        """Queue a request; its steps arrive on the returned slot."""
        length = len(decoder.tokens) + decoder.params.max_tokens + self.max_draft_tokens
        slot = Slot(decoder, length)
        self.waiting.put(slot)
        return slot

    @property
    def running(self) -> int:
        """Requests admitted: being decoded, or their prompt being prefilled."""
        return len(self.rows) + len(self._prefilling)

    @property
    def queued(self) -> int:
        """Requests waiting for admission (the head held for KV room included)."""
        return self.waiting.qsize() + (self._held is not None)

    @property
    def kv_reserved_tokens(self) -> int:
        """Cached positions the running requests may reach (what admission counts)."""
        return kv_tokens_needed([slot.max_length for slot in self._admitted()])

    # -- the loop ----------------------------------------------------------------------
    def _admitted(self) -> list[Slot]:
        return [*self.rows, *(job.slot for job in list(self._prefilling))]

    def _run(self) -> None:
        while True:
            try:
                self._iterate()
            except Exception as err:  # outside a step (admission, a join, staging): every
                self._fail_admitted(err)  # admitted request learns why; the loop goes on

    def _iterate(self) -> None:
        """One turn of the loop (the module docstring's steps 1-3)."""
        self._admit(block=not self.rows and not self._prefilling)
        self._drop_done()
        if self._prefilling:
            self._prefill_step()
        if not self.rows:
            return
        start = time.perf_counter()
        try:
            if len(self.rows) == 1:
                self.solo_steps += 1
                self._deliver(self.rows[0], self.rows[0].decoder.advance())
            else:
                self._batched_step()
        except Exception as err:  # every running request learns why it stopped
            self._fail_all(err)
        if self.chunks is not None:
            self.chunks.observe_step(time.perf_counter() - start)

    def _admit(self, block: bool) -> None:
        new: list[Slot] = []
        while len(self.rows) + len(self._prefilling) + len(new) < self.max_batch_size:
            slot = self._next(block and not new)
            if slot is None:
                break
            if slot.cancelled:
                continue
            if not self._fits(new, slot):
                self._held = slot  # first come, first served: the rest wait behind it
                break
            if not slot.done:  # done: refused as too long for the budget
                new.append(slot)
        if not new:
            return
        try:
            self._take(new)
        except Exception as err:  # the newcomers learn why; what runs may be torn: the
            for slot in new:  # loop (`_run`) fails the rest and goes on
                if not slot.done:
                    slot.out.put(err)
                    slot.done = True
            raise

    def _take(self, new: list[Slot]) -> None:
        """Admitted requests in: staged, or prefilled now and joined to the rows."""
        if self.chunks is not None:
            self._prefilling.extend(PrefillJob(slot) for slot in new)
            return
        if len(new) == 1:
            self._prefill_alone(new[0])
            self._join([slot for slot in new if not slot.done])
            return
        try:
            self._prefill_many(new, [0] * len(new))
        except Exception as err:  # every newcomer learns why it stopped
            for slot in new:
                slot.out.put(err)
                slot.done = True

    def _next(self, block: bool) -> Slot | None:
        """The held head first, then the queue (waiting for one when `block`)."""
        if self._held is not None:
            slot, self._held = self._held, None
            return slot
        if block:
            return self.waiting.get()
        try:
            return self.waiting.get_nowait()
        except queue.Empty:
            return None

    def _fits(self, new: list[Slot], slot: Slot) -> bool:
        """Whether the running rows, the newcomers and `slot` fit the KV capacity; a slot
        too long to fit even alone fails here rather than waiting for ever."""
        if not self.kv_capacity_tokens:
            return True
        lengths = [s.max_length for s in (*self._admitted(), *new, slot)]
        if kv_tokens_needed(lengths) <= self.kv_capacity_tokens:
            return True
        if slot.max_length > self.kv_capacity_tokens:
            slot.out.put(ValueError(_too_long(slot.max_length, self.kv_capacity_tokens)))
            slot.done = True
            return True  # dropped below, as done
        return False

    def _prefill_step(self) -> None:
        """This iteration's staged prefill: the oldest jobs whose whole remaining prompt
        fits the chunk budget together in one pass, else one chunk of the oldest job."""
        assert self.chunks is not None
        jobs = self._ready_jobs()
        if len(jobs) < 2:
            self._prefill_chunk()
            return
        for job in jobs:
            self._prefilling.remove(job)
        slots = [job.slot for job in jobs]
        try:
            cached, reused = [job.position for job in jobs], [job.reused for job in jobs]
            fed, seconds = self._prefill_many(slots, cached, reused)
        except Exception as err:  # every job of the pass learns why it stopped
            for slot in slots:
                slot.out.put(err)
                slot.done = True
            return
        self.chunks.observe_chunk(fed, seconds)
        self.prefill_chunks += 1

    def _ready_jobs(self) -> list[PrefillJob]:
        """The oldest staged prefills, in order, while each one's whole remaining prompt
        and the padded pass of them all stay within this iteration's chunk budget."""
        assert self.chunks is not None
        budget = min(self.chunks.size(_GROUP_TOKENS, decoding=bool(self.rows)), _GROUP_TOKENS)
        jobs: list[PrefillJob] = []
        longest = 0
        for job in self._prefilling:
            if job.slot.cancelled or (not job.started and len(job.decoder.tokens) > budget):
                break
            if not job.started:
                job.start(self.prefix_cache, self.make_cache)
            longest = max(longest, job.remaining)
            if (len(jobs) + 1) * longest > budget:
                break
            jobs.append(job)
        return jobs

    def _prefill_chunk(self) -> None:
        """One chunk of the oldest staged prefill; a finished one joins the rows."""
        assert self.chunks is not None
        job = self._prefilling[0]
        slot = job.slot
        if slot.cancelled:  # the client hung up: the rest of its prompt is not computed
            self._prefilling.pop(0)
            return
        try:
            if not job.started:
                job.start(self.prefix_cache, self.make_cache)
            size = self.chunks.size(job.remaining, decoding=bool(self.rows))
            start = time.perf_counter()
            logits = job.feed(size)
            self.chunks.observe_chunk(size, time.perf_counter() - start)
            self.prefill_chunks += 1
            if logits is None:
                return
            self._prefilling.pop(0)
            job.store(self.prefix_cache)
            self._deliver(slot, slot.decoder.first(logits))
        except Exception as err:  # a bad request fails alone
            self._prefilling.remove(job)
            slot.out.put(err)
            slot.done = True
        if not slot.done:
            self._join([slot])

    def _prefill_alone(self, slot: Slot) -> None:
        try:
            self._deliver(slot, slot.decoder.prefill())
        except Exception as err:  # a bad request fails alone
            slot.out.put(err)
            slot.done = True

    def _prefill_many(
        self, slots: list[Slot], cached: list[int], reused: list[int] | None = None
    ) -> tuple[int, float]:
        """One forward pass over several requests' remaining prompts, each after the
        `cached[i]` positions its own cache holds (left-padded caches, right-aligned
        inputs: a shorter input leaves a hole, masked like padding), of which `reused[i]`
        (default: all) came from the prefix cache and the rest from earlier chunks.
        Identical prompts (the `n` choices of one request, a burst of one prompt) are
        computed once. Each request gets its first token; those that go on join the
        running rows. Returns the tokens fed (padding included) and the pass's seconds."""
        prompts = [tuple(slot.decoder.tokens) for slot in slots]
        unique = list(dict.fromkeys(prompts))
        first = [prompts.index(prompt) for prompt in unique]
        seeded = [cached[i] for i in first]
        tails = [list(prompt[c:]) for prompt, c in zip(unique, seeded, strict=True)]
        width = max(len(tail) for tail in tails)
        caches = [slots[i].decoder.cache for i in first]
        cache = kv_batch.stack_seeded(caches, seeded, self.make_cache)
        ids = torch.tensor([[0] * (width - len(tail)) + tail for tail in tails])
        fed = kv_batch.ones_right([len(tail) for tail in tails], width)
        mask = torch.cat([kv_batch.ones_right(seeded, max(seeded)), fed], dim=1)
        positions = torch.tensor(seeded).unsqueeze(1) + (fed.cumsum(dim=1) - 1).clamp(min=0)
        start = time.perf_counter()
        logits = self.batched_forward(ids, cache, mask, positions, 1)[:, -1]
        seconds = time.perf_counter() - start
        self.prefilled_rows += len(unique)
        lengths = [c + len(tail) for c, tail in zip(seeded, tails, strict=True)]
        rows = KVRows(cache, mask, lengths)
        from_cache = reused if reused is not None else cached
        self._store_prefixes(rows, unique, [from_cache[i] for i in first])
        row_of = {prompt: i for i, prompt in enumerate(unique)}
        for slot, prompt in zip(slots, prompts, strict=True):
            row = row_of[prompt]
            try:
                self._deliver(slot, slot.decoder.first(logits[row : row + 1]))
            except Exception as err:  # a bad request fails alone
                slot.out.put(err)
                slot.done = True
        going = [i for i, slot in enumerate(slots) if not slot.done]
        if going:
            picked = kv_batch.select(rows, [row_of[prompts[i]] for i in going])
            self._add_rows([slots[i] for i in going], picked)
        return ids.numel(), seconds

    def _store_prefixes(
        self, rows: KVRows, prompts: list[tuple[int, ...]], seeded: list[int]
    ) -> None:
        """Offer each prompt's full blocks (its row, holes removed) to the prefix cache;
        a row whose full blocks all came from the cache (`seeded`: the positions the
        prefix cache gave it, not those of its own earlier chunks) is skipped."""
        if self.prefix_cache is None:
            return
        block = self.prefix_cache.block_tokens
        for row, (prompt, reused) in enumerate(zip(prompts, seeded, strict=True)):
            if len(prompt) // block * block > reused:
                self.prefix_cache.insert(prompt, kv_batch.row_layers(rows, row))

    def _drop_done(self) -> None:
        keep = [i for i, slot in enumerate(self.rows) if not (slot.done or slot.cancelled)]
        if len(keep) == len(self.rows):
            return
        if self._batch is not None and len(keep) >= 2:
            self._batch = kv_batch.select(self._batch, keep)
            self.rows = [self.rows[i] for i in keep]
            return
        self._unbatch(keep)
        self.rows = [self.rows[i] for i in keep]

    def _batched_step(self) -> None:
        """One forward pass for every row: its last token plus its draft (right-padded)."""
        batch = self._batch
        assert batch is not None
        offers = [self._offer(slot) for slot in self.rows]
        width = self.policy.width(offers)
        drafts = [o.tokens[:width] if o.adaptive else o.tokens for o in offers]
        width = max(len(d) for d in drafts)
        ids = torch.tensor([[s.decoder.tokens[-1], *d, *[0] * (width - len(d))]
                            for s, d in zip(self.rows, drafts, strict=True)])  # fmt: skip
        ones = torch.ones(len(self.rows), 1 + width, dtype=torch.long)
        mask = torch.cat([batch.mask, ones], dim=1)
        positions = torch.tensor(batch.lengths).unsqueeze(1) + torch.arange(1 + width)
        start = time.perf_counter()
        logits = self.batched_forward(ids, batch.cache, mask, positions, 1 + width)
        elapsed = time.perf_counter() - start
        self.policy.observe(ids.numel(), elapsed)
        self.batch_steps += 1
        self.fed_tokens += ids.numel()
        self.verify_steps += width > 0
        argmax = logits.argmax(dim=-1).tolist()  # one device sync for every greedy row
        kept = []
        for i, slot in enumerate(self.rows):
            if slot.done:  # its proposer raised in `_offer`: it has its error already
                kept.append(0)
                continue
            size = len(drafts[i]) + 1
            try:
                step, accepted = slot.decoder.check(
                    drafts[i], logits[i, :size], elapsed, argmax[i][:size]
                )
            except Exception as err:  # its sampler or proposer: this request fails alone
                self._fail(slot, err)
                kept.append(0)
                continue
            kept.append(accepted)
            self.batched_tokens += len(step[0])
            self._deliver(slot, step)
        self._trim(mask, kept)

    def _offer(self, slot: Slot) -> DraftOffer:
        """The row's draft for a batched step. A proposer that raises fails its own request
        alone: the row is fed its last token with no draft in this pass, its result is not
        delivered, and it is dropped before the next step; the other rows go on."""
        try:
            return slot.decoder.offer()
        except Exception as err:  # one request's proposer, not the batch's pass
            self._fail(slot, err)
            return DraftOffer()

    def _fail(self, slot: Slot, err: Exception) -> None:
        """End one request with `err` (the loop drops it at the next `_drop_done`)."""
        slot.out.put(err)
        slot.done = True

    def _trim(self, mask: torch.Tensor, kept: list[int]) -> None:
        """Hide each row's rejected draft positions; compact once holes waste a quarter."""
        batch = self._batch
        assert batch is not None
        old_width = batch.width
        for i, accepted in enumerate(kept):
            mask[i, old_width + 1 + accepted :] = 0
            batch.lengths[i] += 1 + accepted
        batch.mask = mask
        waste = mask.shape[1] - max(batch.lengths)
        if waste > max(_MIN_WASTE, mask.shape[1] // 4):
            self.compactions += 1
            self._batch = kv_batch.compact(batch, self.make_cache)

    def _deliver(self, slot: Slot, step: Step) -> None:
        slot.out.put(step)
        if step[1] is not None:
            slot.done = True

    def _fail_admitted(self, err: Exception) -> None:
        """`_fail_all`, and the staged prefills too."""
        for job in list(self._prefilling):
            job.slot.out.put(err)
            job.slot.done = True
        self._prefilling.clear()
        self._fail_all(err)

    def _fail_all(self, err: Exception) -> None:
        for slot in self.rows:
            slot.out.put(err)
            slot.done = True
        self._batch, self.rows = None, []

    # -- the batched cache (kv_batch: a few operations per layer, whatever the rows) ----
    def _join(self, slots: list[Slot]) -> None:
        """Add prefilled requests, each with its own cache, to the running rows."""
        if not slots:
            return
        if self._batch is None and not self.rows and len(slots) == 1:
            self.rows.append(slots[0])  # alone: it decodes on its own cache
            return
        caches = [slot.decoder.cache for slot in slots]
        self._add_rows(slots, kv_batch.stack(caches, self.make_cache))

    def _add_rows(self, slots: list[Slot], new: KVRows) -> None:
        """Add requests whose positions are the rows of `new` (in order) to the running
        rows: merged into the batched cache (which a request running alone joins first),
        or, for a single request with nothing else running, given back as its own cache."""
        if not slots:
            return
        if self._batch is None and not self.rows and len(slots) == 1:
            slots[0].decoder.cache = kv_batch.row_cache(new, 0, self.make_cache)
            self.rows.append(slots[0])
            return
        if self._batch is None and self.rows:  # the request running alone joins first
            self._batch = kv_batch.stack([self.rows[0].decoder.cache], self.make_cache)
            self.rows[0].decoder.cache = None
        if self._batch is None:
            self._batch = new
        else:
            self._batch = kv_batch.merge(self._batch, new, self.make_cache)
        self.rows.extend(slots)
        for slot in slots:
            slot.decoder.cache = None  # its positions live in the batched cache now

    def _unbatch(self, rows: Sequence[int] | None = None) -> None:
        """Drop the batched cache, giving the running requests at `rows` (all by default)
        their own unpadded caches again."""
        if self._batch is None:
            return
        for i in range(len(self.rows)) if rows is None else rows:
            self.rows[i].decoder.cache = kv_batch.row_cache(self._batch, i, self.make_cache)
        self._batch = None


def _too_long(length: int, capacity: int) -> str:
    return (
        f"the request may reach {length} cached tokens (prompt, max_tokens and a draft); "
        f"this service's KV budget holds {capacity} (memory_fraction)"
    )
