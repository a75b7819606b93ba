"""A small language model trained on a mixed-chip plan: uneven batch shares, one update.

    argosy plan -m gpt-1.7b -c h100:1+a100-80g:2 --global-batch 36 --seq-len 2048 --json \
        > plan.json
    argosy launch --plan plan.json --emulate-chips h100:1,a100-80g:2 --nproc-per-node 3 \
        --run-dir runs/mixed examples/train_mixed.py --steps 30
    argosy runs show runs/mixed          # throughput: measured, predicted, by group

Each rank takes its share of every step's global batch (the plan's `batch_share` per
chip group, as whole micro-batches), scales its gradient by samples / global batch and
sums it over every rank with the hierarchical all-reduce (inside each chip group, then
between group leaders over gloo), bucketed and overlapped with the last micro-batch's
backward. So one step equals one step of a uniform run with the same global batch.
Without `--plan` every rank takes an even share. The shares then follow the measured
speeds (argosy.runtime.mixed.rebalance; off with `argosy launch --no-rebalance`): the
ranks re-split the same global batch, still as contiguous slices, and the shares in use
go into each checkpoint. Under `--emulate-chips` the ranks are
CPU processes throttled to their chip's relative speed (EMULATION, see
argosy.runtime.mixed.emulate). Model, optimizer and step go into each flash checkpoint;
the data of step s is a function of s, so a resumed run continues exactly.

A layer-split plan (`split: layers`) makes every rank one pipeline stage holding the
plan's layer count for it (the model's depth is the sum of the counts; --layers is then
ignored), trained by a GPipe schedule over gloo send/recv
(argosy.runtime.mixed.pipeline): the losses equal one process's with the same depth and
global batch.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812  # the usual alias

from argosy.runtime import hooks
from argosy.runtime.checkpointing import open_checkpointer, restore
from argosy.runtime.mixed.gradsync import GradSync
from argosy.runtime.mixed.pipeline import GPipe, split_layers
from argosy.runtime.mixed.rank import MixedRank
from argosy.runtime.mixed.weighting import micro_batch_sizes

WORDS = [
    "the",
    "a",
    "ship",
    "sails",
    "over",
    "dark",
    "water",
    "under",
    "bright",
    "stars",
    "while",
    "sailors",
    "sing",
    "of",
    "home",
]


def make_corpus(seed: int, n_chars: int = 40_000) -> str:
    """Seeded pseudo-sentences: enough structure for the loss to fall, no download."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + ". "
        out.append(sentence.capitalize())
        size += len(sentence)
    return "".join(out)


class WindowLM(nn.Module):
    """Next character from a window of `block` characters: embedding, then an MLP."""

    def __init__(self, vocab: int, block: int, dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        widths = [block * dim] + [hidden] * layers
        self.body = nn.Sequential(
            *(
                nn.Sequential(nn.Linear(a, b), nn.GELU())
                for a, b in zip(widths, widths[1:], strict=False)
            )
        )
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.body(self.embed(x).flatten(1))
        return F.cross_entropy(self.head(h), y)


class StepData:
    """Step s's global batch: windows [(s-1)G, sG) of a seeded permutation (per epoch)."""

    def __init__(self, data: torch.Tensor, block: int, global_batch: int, seed: int) -> None:
        self.data, self.block, self.global_batch, self.seed = data, block, global_batch, seed
        self.per_epoch = (len(data) - block - 1) // global_batch
        self._orders: dict[int, torch.Tensor] = {}

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            self._orders = {epoch: torch.randperm(len(self.data) - self.block - 1, generator=g)}
        return self._orders[epoch]

    def slice(self, step: int, offset: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, pos = divmod(step - 1, self.per_epoch)
        first = pos * self.global_batch + offset
        starts = self._order(epoch)[first : first + count].tolist()
        x = torch.stack([self.data[s : s + self.block] for s in starts])
        y = torch.stack([self.data[s + self.block] for s in starts])
        return x, y


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="training steps")
    p.add_argument("--ckpt-every", type=int, default=5, help="steps between flash checkpoints")
    p.add_argument("--global-batch", type=int, default=24, help="sequences per step (no plan)")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--block", type=int, default=32, help="context length")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of throughput")
    p.add_argument("--checkpointer", choices=("auto", "flash", "disk"), default="auto")
    p.add_argument("--pg-timeout", type=float, default=120.0, help="process-group timeout, s")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    else:  # run directly: a world of one
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = hooks.attach()
    mixed = MixedRank.from_env(rank, world, args.global_batch, args.micro_batch)
    mine = mixed.assignment
    text = make_corpus(args.seed)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    stage_layers = [int(r["layers"] or 0) for r in mixed.doc["ranks"]]
    depth = sum(stage_layers) if mine.num_stages > 1 else args.layers  # the plan's counts
    torch.manual_seed(args.seed)
    model = WindowLM(len(chars), args.block, args.dim, args.hidden, depth)
    steps = StepData(data, args.block, mine.global_batch, args.seed)
    mixed.calibrate(lambda: _one_micro_batch(model, steps, mine.micro_batch))
    if mine.num_stages > 1:
        worker: DataParallel | PipelineStage = PipelineStage(model, stage_layers, steps, mixed)
    else:
        worker = DataParallel(model, steps, mixed, rt)
    opt = torch.optim.AdamW(worker.module.parameters(), lr=args.lr)
    run_dir = Path(os.environ.get(hooks.ENV_RUN_DIR, "runs/train_mixed"))
    ckpt = open_checkpointer(
        hooks.checkpoint_dir("runs/train_mixed"),
        keep=3,
        kind=args.checkpointer,
        progress=rt.checkpoint_progress,
    )
    say = lambda msg: print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    start, state = restore(ckpt, say=say)
    if state is not None:
        worker.module.load_state_dict(state["model"])
        opt.load_state_dict(_int_keys(state["optim"]))
        mixed.load_state_dict(state.get("mixed"))  # the shares in use at the checkpoint
        mine = mixed.assignment
        say(f"resumed from step {start}")
    say(
        f"chip {mine.chip} group {mine.group} {_split(mixed)} stage {mine.stage}/"
        f"{mine.num_stages} layers {mine.layers or depth} emulated s/sample "
        f"{mixed.throttle.sample_s:.5f}"
    )
    rt.restored(start, target_step=args.steps, decision=getattr(ckpt, "last_decision", None))
    for step in range(start + 1, args.steps + 1):
        rt.step_begin(step)
        loss_sum, compute_s = worker.run(step, rt)
        total = torch.tensor([loss_sum], dtype=torch.float64)
        rt.enter_collective()  # the loss sum overlaps the gradient sync and the update
        loss_work = dist.all_reduce(total, async_op=True)
        with rt.collective():
            wait_s = worker.finish()
        with rt.checkpoint_fence():
            ckpt.before_optimizer_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_work.wait()
        rt.exit_collective()
        mean_loss = total.item() / mine.global_batch
        rt.step_end(step, mean_loss)
        mixed.record(step, compute_s, wait_s)
        if rank == 0:
            print(f"step {step} loss {mean_loss:.9f} t {time.time():.3f}", flush=True)
        with rt.collective():  # every rank, same steps: shares may follow measured speeds
            if mixed.maybe_rebalance(step):
                say(f"step {step} rebalanced: {_split(mixed)} ({mixed.changes[-1]})")
        if step % args.ckpt_every == 0 or step == args.steps:
            with rt.checkpointing(step):
                state = {"model": worker.module.state_dict(), "optim": opt.state_dict()}
                ckpt.save(step, {**state, "mixed": mixed.state_dict()})
    with rt.checkpoint_fence():
        rt.committed(ckpt.wait())
        ckpt.close()
    mixed.finish(run_dir if "WORLD_SIZE" in os.environ else None, warmup=args.warmup)
    rt.finish()
    dist.destroy_process_group()
    return 0


class DataParallel:
    """A batch-split rank: its share of each step's micro-batches, gradients weighted by
    samples and summed over every rank by the hierarchical all-reduce (GradSync)."""

    def __init__(self, model: WindowLM, steps: StepData, mixed: MixedRank, rt: hooks.Runtime):
        self.module, self.steps, self.mixed = model, steps, mixed
        mine = mixed.assignment
        self.sync = GradSync(model, mixed.allreduce(), weight=mine.weight, pace=mixed.throttle.pace)

    def run(self, step: int, rt: hooks.Runtime) -> tuple[float, float]:
        """This rank's micro-batches of `step`: (summed loss over its samples, busy s)."""
        mine = self.mixed.assignment
        self.sync.weight = mine.weight  # a rebalance moves this rank's share of the sum
        x, y = self.steps.slice(step, mine.sample_offset, mine.samples)
        sizes = micro_batch_sizes(mine.samples, mine.micro_batch)
        loss_sum, start, begin = 0.0, time.perf_counter(), 0
        with rt.compute(), self.mixed.throttle.step():
            for i, size in enumerate(sizes):
                xs, ys = x[begin : begin + size], y[begin : begin + size]
                begin += size
                with self.mixed.throttle.block(size), self.sync.armed(i == len(sizes) - 1):
                    loss = self.module(xs, ys)
                    (loss * (size / mine.samples)).backward()
                loss_sum += loss.item() * size
        return loss_sum, time.perf_counter() - start

    def finish(self) -> float:
        """Wait for the gradient sum; seconds blocked."""
        return self.sync.wait()


class PipelineStage:
    """A layer-split rank: the plan's layer count of the model as one pipeline stage,
    trained by a GPipe schedule over the whole global batch (argosy.runtime.mixed.pipeline).
    Stage 0 holds the embedding, the last stage the head and the loss."""

    def __init__(self, model: WindowLM, counts: list[int], steps: StepData, mixed: MixedRank):
        mine = mixed.assignment
        if min(counts) < 1:
            raise ValueError(f"stage layer counts {counts}: every stage needs a layer")
        part = nn.Sequential(*split_layers(list(model.body), counts)[mine.stage])
        first, last = mine.stage == 0, mine.stage == mine.num_stages - 1
        self.module = nn.Sequential(
            *([_EmbedFlat(model.embed)] if first else []), part, *([model.head] if last else [])
        )
        self.steps, self.mixed = steps, mixed
        self.pipe = GPipe(
            self.module,
            mine.stage,
            mine.num_stages,
            width=model.head.in_features,
            loss_fn=F.cross_entropy if last else None,
            throttle=mixed.throttle,
            work_share=counts[mine.stage] / sum(counts),
        )

    def run(self, step: int, rt: hooks.Runtime) -> tuple[float, float]:
        """GPipe over `step`'s global batch: (summed loss on the last stage, busy s)."""
        mine = self.mixed.assignment
        x, y = self.steps.slice(step, 0, mine.global_batch)
        sizes = micro_batch_sizes(mine.global_batch, mine.micro_batch)
        with rt.collective():  # the stage blocks on its neighbours: not local compute
            loss_sum = self.pipe.step(x.split(sizes), y.split(sizes), sizes, mine.global_batch)
        return loss_sum, self.pipe.busy_s

    def finish(self) -> float:
        """Nothing to sum across stages; seconds blocked on neighbours this step."""
        return self.pipe.wait_s


class _EmbedFlat(nn.Module):
    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x).flatten(1)


def _one_micro_batch(model: nn.Module, steps: StepData, size: int) -> None:
    """Forward and backward of one micro-batch, gradients dropped (calibration)."""
    x, y = steps.slice(1, 0, size)
    model(x, y).backward()
    model.zero_grad(set_to_none=True)


def _split(mixed: MixedRank) -> str:
    """This rank's slice of the step, as the logs (and the kill-and-resume test) show it."""
    mine = mixed.assignment
    return f"samples {mine.samples}/{mine.global_batch} ({mine.micro_batches} micro-batches)"


def _int_keys(optim_state: dict) -> dict:
    """Per-parameter optimizer state is keyed by int; a store may hand the keys back as str."""
    per_param = {int(k): v for k, v in optim_state["state"].items()}
    return {**optim_state, "state": per_param}


if __name__ == "__main__":
    sys.exit(main())
