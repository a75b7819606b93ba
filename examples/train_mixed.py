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
Without `--plan` every rank takes an even share. Under `--emulate-chips` the ranks are
CPU processes throttled to their chip's relative speed (EMULATION, see
argosy.runtime.mixed.emulate). Model, optimizer and step go into each flash checkpoint;
the data of step s is a function of s, so a resumed run continues exactly. The plan's
pipeline stages and layer counts reach the script (`MixedRank.assignment.stage`,
`.layers`); this example trains batch splits only and refuses a layer split.
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
    if mine.num_stages > 1:
        print(
            f"[rank {rank}] the plan is a layer split (stage {mine.stage} of "
            f"{mine.num_stages}, {mine.layers} layers); this example trains batch splits",
            file=sys.stderr,
        )
        return 2
    text = make_corpus(args.seed)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(args.seed)
    model = WindowLM(len(chars), args.block, args.dim, args.hidden, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = StepData(data, args.block, mine.global_batch, args.seed)
    sync = GradSync(model, mixed.allreduce(), weight=mine.weight)
    run_dir = Path(os.environ.get(hooks.ENV_RUN_DIR, "runs/train_mixed"))
    ckpt = open_checkpointer(
        run_dir / "checkpoints", keep=3, kind=args.checkpointer, progress=rt.checkpoint_progress
    )
    say = lambda msg: print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    start, state = restore(ckpt, say=say)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(_int_keys(state["optim"]))
        say(f"resumed from step {start}")
    say(
        f"chip {mine.chip} group {mine.group} samples {mine.samples}/{mine.global_batch} "
        f"({mine.micro_batches} micro-batches) slowdown {mixed.throttle.slowdown:.2f}"
    )
    rt.restored(start, target_step=args.steps, decision=getattr(ckpt, "last_decision", None))
    for step in range(start + 1, args.steps + 1):
        rt.step_begin(step)
        loss_sum, compute_s = train_step(model, steps, step, mixed, sync, rt)
        total = torch.tensor([loss_sum], dtype=torch.float64)
        rt.enter_collective()  # the loss sum overlaps the gradient sync and the update
        loss_work = dist.all_reduce(total, async_op=True)
        with rt.collective():
            wait_s = sync.wait()
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
        if step % args.ckpt_every == 0 or step == args.steps:
            with rt.checkpointing(step):
                ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})
    with rt.checkpoint_fence():
        rt.committed(ckpt.wait())
        ckpt.close()
    mixed.finish(run_dir if "WORLD_SIZE" in os.environ else None, warmup=args.warmup)
    rt.finish()
    dist.destroy_process_group()
    return 0


def train_step(
    model: nn.Module,
    steps: StepData,
    step: int,
    mixed: MixedRank,
    sync: GradSync,
    rt: hooks.Runtime,
) -> tuple[float, float]:
    """This rank's micro-batches of `step`: (summed loss over its samples, busy seconds)."""
    mine = mixed.assignment
    x, y = steps.slice(step, mine.sample_offset, mine.samples)
    sizes = micro_batch_sizes(mine.samples, mine.micro_batch)
    loss_sum, start, begin = 0.0, time.perf_counter(), 0
    with rt.compute():
        for i, size in enumerate(sizes):
            xs, ys = x[begin : begin + size], y[begin : begin + size]
            begin += size
            with mixed.throttle.block(), sync.armed(i == len(sizes) - 1):
                loss = model(xs, ys)
                (loss * (size / mine.samples)).backward()
            loss_sum += loss.item() * size
    return loss_sum, time.perf_counter() - start


def _int_keys(optim_state: dict) -> dict:
    """Per-parameter optimizer state is keyed by int; a store may hand the keys back as str."""
    per_param = {int(k): v for k, v in optim_state["state"].items()}
    return {**optim_state, "state": per_param}


if __name__ == "__main__":
    sys.exit(main())
