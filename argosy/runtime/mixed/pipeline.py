"""Pipeline stages of a layer-split plan: a GPipe schedule over torch.distributed send/recv.

A layer-split plan gives every rank one pipeline stage and that stage's layer count
(`RankAssignment.stage`, `.layers`). `split_layers` cuts a stack of layers by those
counts; `GPipe` runs one training step of a stage: every micro-batch forward (receive
the activation from the previous stage, run the stage, send to the next), then every
micro-batch backward in reverse order (receive the output's gradient from the next
stage, backward, send the input's gradient to the previous one). The last stage
computes the loss of each micro-batch scaled by its share of the global batch, so the
parameters' gradients are those of the global-batch mean loss, as on one process (up to
float summation order). Activations between stages are float32 `(samples, width)`
tensors; blocking send/recv (gloo) is enough, as each stage talks to its neighbours in
one fixed order.

    parts = split_layers(layers, [16, 4, 4])           # the plan's counts, in stage order
    pipe = GPipe(stage_module, stage=1, num_stages=3, width=64)
    loss_sum = pipe.step(inputs, targets, sizes, global_batch)   # last stage; 0.0 elsewhere
    opt.step()

Under chip emulation, each stage's forward and backward blocks run through the rank's
`Throttle`, sized by the stage's share of the model's layers (`work_share`). Knows
nothing of plans or launches beyond the counts it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn

from argosy.runtime.mixed.emulate import FORWARD_SHARE, Throttle

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def split_layers(layers: Sequence[nn.Module], counts: Sequence[int]) -> list[list[nn.Module]]:
    """Consecutive runs of `layers`, one per stage, of the plan's `counts`."""
    if sum(counts) != len(layers) or any(c < 0 for c in counts):
        raise ValueError(
            f"stage layer counts {list(counts)} (sum {sum(counts)}) do not cover the "
            f"model's {len(layers)} layers"
        )
    out, begin = [], 0
    for count in counts:
        out.append(list(layers[begin : begin + count]))
        begin += count
    return out


class GPipe:
    """One pipeline stage's side of a GPipe step; see the module docstring."""

    def __init__(
        self,
        module: nn.Module,
        stage: int,
        num_stages: int,
        width: int,
        loss_fn: LossFn | None = None,
        throttle: Throttle | None = None,
        work_share: float = 1.0,
    ) -> None:
        if not 0 <= stage < num_stages:
            raise ValueError(f"stage {stage} outside 0..{num_stages - 1}")
        if stage == num_stages - 1 and loss_fn is None:
            raise ValueError("the last stage needs a loss_fn")
        self.module, self.stage, self.num_stages, self.width = module, stage, num_stages, width
        self.loss_fn = loss_fn
        self.throttle = throttle
        self.work_share = work_share
        self.first, self.last = stage == 0, stage == num_stages - 1
        self.busy_s = 0.0
        """Seconds in this stage's forward and backward blocks, last step."""
        self.wait_s = 0.0
        """Seconds blocked receiving from a neighbour stage, last step."""

    def step(
        self,
        inputs: Sequence[torch.Tensor] | None,
        targets: Sequence[torch.Tensor] | None,
        sizes: Sequence[int],
        global_batch: int,
    ) -> float:
        """Forward then backward of every micro-batch (`sizes`: samples in each). The first
        stage needs `inputs`, the last `targets`; returns the last stage's summed loss
        (mean loss x samples, over all micro-batches), 0.0 on the other stages."""
        self.busy_s = self.wait_s = 0.0
        saved: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        loss_sum = 0.0
        for m, size in enumerate(sizes):
            if self.first:
                assert inputs is not None
                x = inputs[m]
            else:
                x = self._recv((size, self.width), self.stage - 1).requires_grad_()
            with self._block(size * FORWARD_SHARE):
                out = self.module(x)
                if self.last:
                    assert self.loss_fn is not None and targets is not None
                    loss = self.loss_fn(out, targets[m])
                    loss_sum += float(loss) * size
                    out = loss * (size / global_batch)
            if not self.last:
                dist.send(out.detach().contiguous(), dst=self.stage + 1)
            saved.append((None if self.first else x, out))
        for m in reversed(range(len(sizes))):
            x, out = saved[m]
            grad = None if self.last else self._recv(tuple(out.shape), self.stage + 1)
            with self._block(sizes[m] * (1.0 - FORWARD_SHARE)):
                out.backward(grad)
            if x is not None:
                assert x.grad is not None
                dist.send(x.grad.contiguous(), dst=self.stage - 1)
        return loss_sum

    def _recv(self, shape: tuple[int, ...], src: int) -> torch.Tensor:
        start = time.perf_counter()
        buf = torch.empty(shape)
        dist.recv(buf, src=src)
        self.wait_s += time.perf_counter() - start
        return buf

    @contextmanager
    def _block(self, samples: float) -> Iterator[None]:
        """A throttled block (when emulated) whose wall time adds to the busy time."""
        start = time.perf_counter()
        work = samples * self.work_share
        with self.throttle.block(work) if self.throttle is not None else nullcontext():
            yield
        self.busy_s += time.perf_counter() - start
