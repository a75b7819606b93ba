"""Gradient sync for argosy's own training loop: bucketed, overlapped with backward.

`GradSync` cuts the model's parameters into buckets (reverse registration order, about
`bucket_bytes` each, as DDP does) and registers a post-accumulate-grad hook on each
parameter. During the backward of the step's last micro-batch (`armed()`), a bucket whose
gradients are all accumulated is copied into a flat buffer, scaled by this rank's weight
and handed to the hierarchical all-reduce while backward goes on with the earlier
layers. `wait()` then blocks until every bucket is summed, makes each `.grad` a view
of its bucket's summed buffer (a fresh buffer every step: no copy back), and records
the time it blocked: the time lost waiting at the cross-group all-reduce
(communication not hidden by backward, plus waiting for slower groups).

    sync = GradSync(model, allreduce, weight=assignment.weight, pace=throttle.pace)
    for i, (x, y) in enumerate(micro_batches):
        with sync.armed(i == len(micro_batches) - 1):
            (model(x, y) * scale[i]).backward()
    sync.wait()            # sync.wait_s: seconds blocked in this step's wait
    opt.step()

Under chip emulation, `pace(fraction)` (the throttle's) holds each bucket until the
emulated chip would have produced it: `fraction` is the share of the parameters whose
gradients are done once this bucket is (backward runs in reverse layer order, its cost
about proportional to parameters). Without it the fast host CPU would launch every bucket
at the start of the emulated backward and hide the whole all-reduce behind the sleep.

Buckets are launched in index order on every rank, whatever order autograd finishes
them in, so the collectives match across ranks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from argosy.runtime.mixed.allreduce import HierarchicalAllReduce

DEFAULT_BUCKET_BYTES = 1 * 2**20


class GradSync:
    """Weighted, bucketed gradient sum over every rank; see the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        allreduce: HierarchicalAllReduce,
        weight: float,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        pace: Callable[[float], None] | None = None,
    ) -> None:
        self.allreduce = allreduce
        self.weight = weight
        self.pace = pace
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = _buckets(self.params, bucket_bytes)
        sizes = [sum(p.numel() for p in bucket) for bucket in self.buckets]
        total = max(1, sum(sizes))
        self.done_fraction = [done / total for done in itertools.accumulate(sizes)]
        """Share of all parameters whose gradients are done once bucket b is."""
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        self.wait_s = 0.0
        self._armed = False
        self._reset()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def _reset(self) -> None:
        self._ready = [0] * len(self.buckets)
        self._launched = 0
        self._pending: list[tuple[torch.Tensor, torch.futures.Future]] = []

    @contextmanager
    def armed(self, last_micro_batch: bool = True) -> Iterator[None]:
        """Launch bucket all-reduces during this backward (the step's last micro-batch)."""
        self._armed = last_micro_batch
        try:
            yield
        finally:
            self._armed = False

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self._armed:
            return
        b = self.bucket_of[id(param)]
        self._ready[b] += 1
        while self._launched < len(self.buckets) and self._ready[self._launched] == len(
            self.buckets[self._launched]
        ):
            self._launch(self._launched)

    def _launch(self, b: int) -> None:
        if self.pace is not None:
            self.pace(self.done_fraction[b])
        grads = [_grad(p) for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(self.weight)
        self._pending.append((flat, self.allreduce.all_reduce(flat)))
        self._launched += 1

    def wait(self) -> float:
        """Finish the sum (launching buckets backward never completed), write it into
        `.grad`; returns and stores in `wait_s` the seconds spent blocked here."""
        start = time.perf_counter()
        while self._launched < len(self.buckets):
            self._launch(self._launched)
        for b, (flat, fut) in enumerate(self._pending):
            fut.wait()
            offset = 0
            for p in self.buckets[b]:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p)  # a view: no copy back
                offset += n
        self._reset()
        self.wait_s = time.perf_counter() - start
        return self.wait_s


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Reverse registration order (backward produces the last layers' gradients first)."""
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for p in reversed(params):
        if out[-1] and size + p.numel() * p.element_size() > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel() * p.element_size()
    return out
