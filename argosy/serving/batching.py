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
   accepted prefix (the decoder's lossless rule).

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
the KV capacity at once. Each loop iteration runs one chunk of the oldest job (its prompt
on top of the longest cached prefix) before the running rows' decode step; a job whose
prompt is in joins the rows with its first token. Identical prompts are then not computed
together; the prefix cache gives the later ones every full block of the first.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from argosy.serving.budget import kv_tokens_needed
from argosy.serving.decoding import Decoder
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
        self._cache: Any = None  # the batched cache while two or more rows run
        self._mask: torch.Tensor | None = None
        self._lengths: list[int] = []
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
            self._admit(block=not self.rows and not self._prefilling)
            self._drop_done()
            if self._prefilling:
                self._prefill_chunk()
            if not self.rows:
                continue
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
        if self.chunks is not None:
            self._prefilling.extend(PrefillJob(slot) for slot in new)
            return
        if len(new) >= 2:
            try:
                self._prefill_together(new)
            except Exception as err:  # every newcomer learns why it stopped
                for slot in new:
                    slot.out.put(err)
                new = []
        else:
            self._prefill_alone(new[0])
        self._join([slot for slot in new if not slot.done])

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

    def _prefill_together(self, slots: list[Slot]) -> None:
        """One left-padded forward pass over the newcomers' distinct prompts (the `n`
        choices of one request share theirs: it is computed once); each newcomer gets its
        own copy of its prompt's cache."""
        prompts = [tuple(slot.decoder.tokens) for slot in slots]
        unique = list(dict.fromkeys(prompts))
        row_of = {prompt: i for i, prompt in enumerate(unique)}
        width = max(len(p) for p in unique)
        ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in unique])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in unique])
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = self.make_cache([])
        logits = self.batched_forward(ids, cache, mask, positions, 1)[:, -1]
        self.prefilled_rows += len(unique)
        for slot, prompt in zip(slots, prompts, strict=True):
            row = row_of[prompt]
            start = width - len(prompt)
            layers = [
                (_row(lay.keys, row, start), _row(lay.values, row, start)) for lay in cache.layers
            ]
            slot.decoder.cache = self.make_cache(layers)
            self._deliver(slot, slot.decoder.first(logits[row : row + 1]))

    def _drop_done(self) -> None:
        keep = [i for i, slot in enumerate(self.rows) if not (slot.done or slot.cancelled)]
        if len(keep) == len(self.rows):
            return
        if self._cache is not None and len(keep) >= 2:
            where = self._cache.layers[0].keys.device
            self._cache.batch_select_indices(torch.tensor(keep, device=where))
            assert self._mask is not None
            self._mask = self._mask[keep]
            self._lengths = [self._lengths[i] for i in keep]
            self.rows = [self.rows[i] for i in keep]
            return
        self._unbatch(keep)
        self.rows = [self.rows[i] for i in keep]

    def _batched_step(self) -> None:
        """One forward pass for every row: its last token plus its draft (right-padded)."""
        assert self._cache is not None and self._mask is not None
        offers = [slot.decoder.offer() for slot in self.rows]
        width = self.policy.width(offers)
        drafts = [o.tokens[:width] if o.adaptive else o.tokens for o in offers]
        width = max(len(d) for d in drafts)
        ids = torch.tensor([[s.decoder.tokens[-1], *d, *[0] * (width - len(d))]
                            for s, d in zip(self.rows, drafts, strict=True)])  # fmt: skip
        ones = torch.ones(len(self.rows), 1 + width, dtype=torch.long)
        mask = torch.cat([self._mask, ones], dim=1)
        positions = torch.tensor(self._lengths).unsqueeze(1) + torch.arange(1 + width)
        start = time.perf_counter()
        logits = self.batched_forward(ids, self._cache, mask, positions, 1 + width)
        elapsed = time.perf_counter() - start
        self.policy.observe(ids.numel(), elapsed)
        self.batch_steps += 1
        self.fed_tokens += ids.numel()
        self.verify_steps += width > 0
        argmax = logits.argmax(dim=-1).tolist()  # one device sync for every greedy row
        kept = []
        for i, slot in enumerate(self.rows):
            size = len(drafts[i]) + 1
            step, accepted = slot.decoder.check(
                drafts[i], logits[i, :size], elapsed, argmax[i][:size]
            )
            kept.append(accepted)
            self.batched_tokens += len(step[0])
            self._deliver(slot, step)
        self._trim(mask, kept)

    def _trim(self, mask: torch.Tensor, kept: list[int]) -> None:
        """Hide each row's rejected draft positions; compact once holes waste a quarter."""
        old_width = self._mask.shape[1] if self._mask is not None else 0
        for i, accepted in enumerate(kept):
            mask[i, old_width + 1 + accepted :] = 0
            self._lengths[i] += 1 + accepted
        self._mask = mask
        waste = mask.shape[1] - max(self._lengths)
        if waste > max(_MIN_WASTE, mask.shape[1] // 4):
            self.compactions += 1
            self._compact()

    def _deliver(self, slot: Slot, step: Step) -> None:
        slot.out.put(step)
        if step[1] is not None:
            slot.done = True

    def _fail_all(self, err: Exception) -> None:
        for slot in self.rows:
            slot.out.put(err)
            slot.done = True
        self._cache, self._mask, self._lengths, self.rows = None, None, [], []

    # -- the batched cache -------------------------------------------------------------
    # Joining, leaving and compaction cost a few tensor operations per layer whatever the
    # number of rows: on a GPU a step is launch-bound, so work per row and layer (thousands
    # of small copies at 64 rows) would cost more than the decode step itself.
    def _join(self, slots: list[Slot]) -> None:
        """Add prefilled requests (each with its own cache) to the running rows: with a
        batched cache running, one left-padded concatenation per layer; the rows already
        there are not split."""
        if not slots:
            return
        if self._cache is None:
            self.rows.extend(slots)
            self._rebatch()
            return
        assert self._mask is not None
        caches = [slot.decoder.cache for slot in slots]
        lengths = [int(cache.get_seq_length()) for cache in caches]
        width = max(self._mask.shape[1], *lengths)
        layers = []
        for index, old in enumerate(self._cache.layers):
            keys = [_left_pad(old.keys, width)]
            values = [_left_pad(old.values, width)]
            for cache in caches:
                keys.append(_left_pad(cache.layers[index].keys, width))
                values.append(_left_pad(cache.layers[index].values, width))
            layers.append((torch.cat(keys), torch.cat(values)))
        self._cache = self.make_cache(layers)
        self._mask = torch.cat([_left_pad_mask(self._mask, width), _ones_right(lengths, width)])
        self._lengths.extend(lengths)
        self.rows.extend(slots)
        for slot in slots:
            slot.decoder.cache = None  # its positions live in the batched cache now

    def _compact(self) -> None:
        """Squeeze out every row's masked-out positions (rejected drafts, padding): one
        gather per layer, rows left-padded to the longest again."""
        assert self._cache is not None and self._mask is not None
        width = max(self._lengths)
        index = torch.zeros(len(self.rows), width, dtype=torch.long)
        for i, length in enumerate(self._lengths):
            index[i, width - length :] = self._mask[i].nonzero().flatten()
        index = index.to(self._cache.layers[0].keys.device)
        layers = []
        for layer in self._cache.layers:
            keys, values = layer.keys, layer.values
            gather = index[:, None, :, None].expand(
                keys.shape[0], keys.shape[1], width, keys.shape[3]
            )
            layers.append((keys.gather(2, gather), values.gather(2, gather)))
        self._cache = self.make_cache(layers)
        self._mask = _ones_right(self._lengths, width)

    def _unbatch(self, rows: Sequence[int] | None = None) -> None:
        """Drop the batched cache, giving the running requests at `rows` (all by default)
        their own unpadded caches again."""
        if self._cache is None:
            return
        assert self._mask is not None
        device = self._cache.layers[0].keys.device
        for i in range(len(self.rows)) if rows is None else rows:
            keep = self._mask[i].nonzero().flatten().to(device)
            layers = [
                (_kept(layer.keys, i, keep), _kept(layer.values, i, keep))
                for layer in self._cache.layers
            ]
            self.rows[i].decoder.cache = self.make_cache(layers)
        self._cache, self._mask, self._lengths = None, None, []

    def _rebatch(self) -> None:
        """Left-pad the running requests' caches into one batch (two or more rows)."""
        if len(self.rows) < 2:
            return
        caches = [slot.decoder.cache for slot in self.rows]
        self._lengths = [int(cache.get_seq_length()) for cache in caches]
        width = max(self._lengths)
        layers = []
        for index in range(len(caches[0].layers)):
            keys = [_left_pad(c.layers[index].keys, width) for c in caches]
            values = [_left_pad(c.layers[index].values, width) for c in caches]
            layers.append((torch.cat(keys), torch.cat(values)))
        self._cache = self.make_cache(layers)
        self._mask = _ones_right(self._lengths, width)
        for slot in self.rows:
            slot.decoder.cache = None  # its positions live in the batched cache now


def _too_long(length: int, capacity: int) -> str:
    return (
        f"the request may reach {length} cached tokens (prompt, max_tokens and a draft); "
        f"this service's KV budget holds {capacity} (memory_fraction)"
    )


def _row(tensor: torch.Tensor, row: int, start: int) -> torch.Tensor:
    """Row `row` of a batched [B, heads, T, dim] tensor from position `start`, as [1, ...]."""
    return tensor[row : row + 1, :, start:].clone()


def _kept(tensor: torch.Tensor, row: int, keep: torch.Tensor) -> torch.Tensor:
    """Row `row` of a batched [B, heads, T, dim] tensor at the positions `keep` lists."""
    return tensor[row : row + 1, :, keep]


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[1, heads, length, dim] -> [1, heads, width, dim], zeros on the left."""
    missing = width - tensor.shape[2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([pad, tensor], dim=2)


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    """[B, length] attention mask -> [B, width], zeros (hidden) on the left."""
    missing = width - mask.shape[1]
    if missing == 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], missing), mask], dim=1)


def _ones_right(lengths: Sequence[int], width: int) -> torch.Tensor:
    """A [len(lengths), width] attention mask whose row i shows its last `lengths[i]`."""
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, width - length :] = 1
    return mask
