"""A small GPT trained data-parallel on CPU or GPUs, fault-tolerant under `argosy launch`.

    argosy launch --nproc-per-node 2 --run-dir runs/demo examples/train_gpt.py --steps 60
    argosy launch --nproc-per-node 2 --inject kill:rank=1:step=30 examples/train_gpt.py
    argosy launch --nproc-per-node 8 examples/train_gpt.py --device cuda

`--device auto` (the default) trains on the GPUs when every local rank can have one of its
own, else on CPU; `cuda` puts rank LOCAL_RANK on `cuda:<LOCAL_RANK % GPUs>` and reduces
with NCCL; `cpu` uses gloo (argosy.runtime.devices). `--deterministic` (the default) turns
on torch's deterministic algorithms (and cuBLAS's fixed workspace, before CUDA starts).

The corpus is generated (seeded sentences over a fixed vocabulary), so nothing is
downloaded. Model, optimizer, data-loader position and RNG state go into every flash
checkpoint, so a resumed run continues exactly as the run that never failed: the loss
at every step is bitwise the same, on a GPU too (the CUDA generator's state is saved as
well). Rank 0's last line is `final step N loss L params <sha256 of the parameters>`.
`--fsdp` shards the model with FSDP instead of DDP. Run directly (python
examples/train_gpt.py) it trains as a single process.
"""

from __future__ import annotations

import argparse
import hashlib
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
from argosy.runtime.devices import FORMS, backend_for, resolve_device

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
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
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
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
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
    p.add_argument("--device", default="auto", help=f"{FORMS} (default auto)")
    p.add_argument(
        "--deterministic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="deterministic algorithms (bit-exact resume on GPUs too)",
    )
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds added to each step")
    p.add_argument("--pg-timeout", type=float, default=120.0, help="process-group timeout, s")
    return p.parse_args(argv)


def pick_device(spec: str, deterministic: bool) -> torch.device:
    """This rank's device (argosy.runtime.devices), made current; exits 2 on a bad spec.

    Deterministic: cuBLAS's workspace is fixed before CUDA starts, then torch's
    deterministic algorithms are turned on."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        device = torch.device(resolve_device(spec, local_rank, cuda_count(), local_world))
    except ValueError as err:
        print(f"train_gpt: --device: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.accelerator.set_device_index(device)
    return device


def cuda_count() -> int:
    """CUDA devices this process sees (torch.accelerator: device calls stay generic here)."""
    found = torch.accelerator.current_accelerator(check_available=True)
    return torch.accelerator.device_count() if found is not None and found.type == "cuda" else 0


def init_distributed(timeout_s: float, device: torch.device) -> tuple[int, int]:
    torch.set_num_threads(1)
    if "WORLD_SIZE" not in os.environ:
        return 0, 1
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend_for(str(device)), timeout=timedelta(seconds=timeout_s), **kwargs
    )
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

    device = next(model.parameters()).device
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    rt.watch_ddp(ddp)
    return ddp


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device, args.deterministic)
    rank, world = init_distributed(args.pg_timeout, device)
    rt = hooks.attach()
    text = make_corpus(args.seed)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    torch.manual_seed(args.seed)
    model = GPT(len(chars), args.block, args.dim, args.layers, args.heads, args.dropout)
    model = wrap(model.to(device), args, rt)
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
    say(f"device {describe(device)}, backend {backend_for(str(device))}")
    start, state = restore(ckpt, say=say)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(_int_keys(state["optim"]))
        loader.load_state_dict(state["loader"])
        set_rng(state, device)
        say(f"resumed from step {start}")
    rt.restored(start, target_step=args.steps, decision=getattr(ckpt, "last_decision", None))
    rt.work_per_step(tokens=args.batch * args.block * world, samples=args.batch * world)

    loss_sum = torch.zeros(1, device=device)
    mean_loss = float("nan")
    for step in range(start + 1, args.steps + 1):
        rt.step_begin(step)
        x, y = (t.to(device) for t in loader.next())
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
                ckpt.save(step, snapshot(model, opt, loader, device))
    with rt.checkpoint_fence():  # the last snapshot is committed, then the persister stops
        rt.committed(ckpt.wait())
        ckpt.close()
    if rank == 0:
        print(f"final step {args.steps} loss {mean_loss:.6f} params {digest(model)}", flush=True)
    rt.finish()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _int_keys(optim_state: dict) -> dict:
    """Per-parameter optimizer state is keyed by int; a store may hand the keys back as str."""
    per_param = {int(k): v for k, v in optim_state["state"].items()}
    return {**optim_state, "state": per_param}


def snapshot(
    model: nn.Module, opt: torch.optim.Optimizer, loader: Loader, device: torch.device
) -> dict:
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "loader": loader.state_dict(),
        "rng": torch.get_rng_state(),
    }
    if device.type == "cuda":  # dropout on the GPU draws from the device's generator
        state["cuda_rng"] = torch.get_device_module(device).get_rng_state(device)
    return state


def set_rng(state: dict, device: torch.device) -> None:
    """The generators as the snapshot left them (the CUDA one only when saved from a GPU)."""
    torch.set_rng_state(state["rng"])
    if device.type == "cuda" and "cuda_rng" in state:
        torch.get_device_module(device).set_rng_state(state["cuda_rng"].cpu(), device)


def digest(model: nn.Module) -> str:
    """sha256 of this rank's parameters and buffers, by name: equal only when bitwise equal."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        h.update(name.encode())
        h.update(local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def describe(device: torch.device) -> str:
    if device.type != "cuda":
        return str(device)
    return f"{device} ({torch.get_device_module(device).get_device_name(device)})"


if __name__ == "__main__":
    sys.exit(main())
