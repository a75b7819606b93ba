"""A small GPT trained data-parallel on CPU (gloo), fault-tolerant under `argosy launch`.

    argosy launch --nproc-per-node 2 --run-dir runs/demo examples/train_gpt.py --steps 60
    argosy launch --nproc-per-node 2 --inject kill:rank=1:step=30 examples/train_gpt.py

The corpus is generated (seeded sentences over a fixed vocabulary), so nothing is
downloaded. Model, optimizer, data-loader position and RNG state go into every flash
checkpoint, so a resumed run continues exactly as the run that never failed: the loss
at every step is bitwise the same. `--fsdp` shards the model with FSDP instead of DDP.
Run directly (python examples/train_gpt.py) it trains as a single process.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812  # the usual alias

from argosy.runtime import hooks
from argosy.runtime.checkpointing import open_checkpointer, restore

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
    "and",
    "distant",
    "harbours",
    "where",
    "the",
    "wind",
    "is",
    "kind",
    "and",
    "bread",
    "is",
    "warm",
    "each",
    "night",
    "the",
    "captain",
    "reads",
    "the",
    "old",
    "map",
    "by",
    "lamp",
    "light",
    "and",
    "marks",
    "the",
    "course",
    "to",
    "islands",
    "no",
    "one",
    "has",
    "seen",
]


def make_corpus(seed: int, n_chars: int = 60_000) -> str:
    """Seeded pseudo-sentences: enough structure for the loss to fall, no download."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + ". "
        out.append(sentence.capitalize())
        size += len(sentence)
    return "".join(out)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, vocab: int, block: int, dim: int, layers: int, heads: int, dropout: float):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        logits = self.head(self.ln(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class Loader:
    """Each rank's share of a seeded permutation of windows; its state is (epoch, pos)."""

    def __init__(
        self, data: torch.Tensor, block: int, batch: int, rank: int, world: int, seed: int
    ):
        self.data, self.block, self.batch = data, block, batch
        self.rank, self.world, self.seed = rank, world, seed
        self.epoch, self.pos = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(len(self.data) - self.block - 1, generator=g)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        per_step = self.batch * self.world
        if (self.pos + 1) * per_step > len(self._order):
            self.epoch, self.pos = self.epoch + 1, 0
            self._order = self._permutation()
        first = self.pos * per_step + self.rank * self.batch
        starts = self._order[first : first + self.batch]
        self.pos += 1
        x = torch.stack([self.data[s : s + self.block] for s in starts.tolist()])
        y = torch.stack([self.data[s + 1 : s + 1 + self.block] for s in starts.tolist()])
        return x, y

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="training steps")
    p.add_argument("--ckpt-every", type=int, default=5, help="steps between flash checkpoints")
    p.add_argument(
        "--ckpt-dir",
        default=None,
        help="default: the job's store, $ARGOSY_CKPT_DIR (argosy launch --ckpt-dir)",
    )
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--block", type=int, default=32, help="context length")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--checkpointer",
        choices=("auto", "flash", "disk"),
        default="auto",
        help="auto: the flash checkpointer when installed, else plain torch.save to disk",
    )
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP instead of DDP")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds added to each step")
    p.add_argument("--pg-timeout", type=float, default=120.0, help="process-group timeout, s")
    return p.parse_args(argv)


def init_distributed(timeout_s: float) -> tuple[int, int]:
    torch.set_num_threads(1)
    if "WORLD_SIZE" not in os.environ:
        return 0, 1
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def wrap(model: nn.Module, args: argparse.Namespace, rt: hooks.Runtime) -> nn.Module:
    if not dist.is_initialized():
        return model
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model)
    rt.watch_ddp(ddp)
    return ddp


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = init_distributed(args.pg_timeout)
    rt = hooks.attach()
    text = make_corpus(args.seed)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    torch.manual_seed(args.seed)
    model = GPT(len(chars), args.block, args.dim, args.layers, args.heads, args.dropout)
    model = wrap(model, args, rt)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = Loader(data, args.block, args.batch, rank, world, args.seed)
    torch.manual_seed(args.seed + 1 + rank)  # dropout differs per rank, reproducibly

    ckpt = open_checkpointer(
        args.ckpt_dir or hooks.checkpoint_dir("runs/train_gpt"),
        keep=3,
        kind=args.checkpointer,
        progress=rt.checkpoint_progress,
    )
    say = lambda msg: print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    start, state = restore(ckpt, say=say)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(_int_keys(state["optim"]))
        loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        say(f"resumed from step {start}")
    rt.restored(start, target_step=args.steps, decision=getattr(ckpt, "last_decision", None))

    loss_sum = torch.zeros(1)
    for step in range(start + 1, args.steps + 1):
        rt.step_begin(step)
        x, y = loader.next()
        with rt.compute():
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with rt.checkpoint_fence():  # waits for the previous snapshot's copy
            ckpt.before_optimizer_step()
        opt.step()
        loss_sum.copy_(loss.detach())
        if world > 1:
            with rt.collective():
                dist.all_reduce(loss_sum)
        mean_loss = loss_sum.item() / world
        if args.step_sleep:
            time.sleep(args.step_sleep)
        rt.step_end(step, mean_loss)
        if rank == 0:
            print(f"step {step} loss {mean_loss:.6f} t {time.time():.3f}", flush=True)
        if step % args.ckpt_every == 0 or step == args.steps:
            with rt.checkpointing(step):
                ckpt.save(step, snapshot(model, opt, loader))
    with rt.checkpoint_fence():  # the last snapshot is committed, then the persister stops
        rt.committed(ckpt.wait())
        ckpt.close()
    rt.finish()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _int_keys(optim_state: dict) -> dict:
    """Per-parameter optimizer state is keyed by int; a store may hand the keys back as str."""
    per_param = {int(k): v for k, v in optim_state["state"].items()}
    return {**optim_state, "state": per_param}


def snapshot(model: nn.Module, opt: torch.optim.Optimizer, loader: Loader) -> dict:
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "loader": loader.state_dict(),
        "rng": torch.get_rng_state(),
    }


if __name__ == "__main__":
    sys.exit(main())
