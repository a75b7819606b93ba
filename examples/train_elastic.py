"""A tiny data-parallel job (gloo, CPU) that can be resized through its checkpoint.

    argosy launch --nproc-per-node 1 --run-dir runs/el examples/train_elastic.py --steps 400
    # stop it (SIGTERM), then start it again with 2 ranks in the same run dir:
    argosy launch --nproc-per-node 2 --run-dir runs/el examples/train_elastic.py --steps 400

What makes it elastic, for the control plane's tidal lease (docs/tidal.md):

- SIGTERM does not kill it mid-step: every rank notes it, the ranks agree on it in the
  step's all-reduce (so all stop after the same step), save that step, wait until it is
  durable on disk and exit 0.
- It restores with `FlashCheckpointer.load(into=...)`: the state to fill is built first
  (model, optimizer primed with a zero step, step counter), so a checkpoint written by a
  different number of ranks is resharded from disk by DCP. The model is replicated (DDP),
  so any world size restores it whole.
- Each step's data depends only on the step and rank, and the learning rate scales with
  the world size (the global batch grows with it), so the step counter just continues.

Every rank prints `step N loss L world W` (rank 0) and the resumed step, for tests.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from argosy.checkpoint import FlashCheckpointer
from argosy.runtime import hooks

STOP = {"asked": False}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="training steps in all")
    p.add_argument("--ckpt-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--step-s", type=float, default=0.1, help="seconds each step sleeps")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2, help="learning rate of one rank")
    return p.parse_args(argv)


def _on_term(_signum: int, _frame: object) -> None:
    STOP["asked"] = True


def batch(step: int, rank: int, size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank's samples of `step`: a fixed linear target plus noise."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(size, dim, generator=g)
    w = torch.linspace(-1.0, 1.0, dim)
    return x, (x @ w).unsqueeze(1) + 0.01 * torch.randn(size, 1, generator=g)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = hooks.attach()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(args.dim, 64), nn.ReLU(), nn.Linear(64, 1))
    )
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * world)
    store = hooks.checkpoint_dir("runs/train_elastic")
    ckpt = FlashCheckpointer(store, keep=3, progress=rt.checkpoint_progress)
    start = restore(ckpt, model, opt, world)
    rt.restored(start, target_step=args.steps, decision=ckpt.last_decision)
    step = start
    while step < args.steps:
        step += 1
        rt.step_begin(step)
        x, y = batch(step, rank, args.batch, args.dim)
        with rt.compute():
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with rt.checkpoint_fence():
            ckpt.before_optimizer_step()
        opt.step()
        shared = torch.tensor([loss.item(), float(STOP["asked"])])
        with rt.collective():
            dist.all_reduce(shared)  # the mean loss, and whether any rank was asked to stop
        time.sleep(args.step_s)
        rt.step_end(step, float(shared[0]) / world)
        if rank == 0:
            print(f"step {step} loss {float(shared[0]) / world:.6f} world {world}", flush=True)
        stopping = shared[1] > 0
        if step % args.ckpt_every == 0 or step == args.steps or stopping:
            with rt.checkpointing(step):
                ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})
        if stopping:
            break
    with rt.checkpoint_fence():
        rt.committed(ckpt.wait())
        ckpt.close()
    if rank == 0 and step < args.steps:
        print(f"stopped at step {step}: checkpointed for a restart", flush=True)
    if step >= args.steps:
        rt.finish()
    dist.destroy_process_group()
    return 0


def restore(
    ckpt: FlashCheckpointer, model: nn.Module, opt: torch.optim.Optimizer, world: int
) -> int:
    """The newest step every rank can load, filled into the live model and optimizer (0:
    nothing saved). The optimizer's state is primed first (a step with zero gradients
    moves no weight under Adam), so the state to fill has every key a checkpoint holds."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    template: dict[str, Any] = {"model": model.state_dict(), "optim": opt.state_dict()}
    got = ckpt.load(into=template)
    if got is None:
        opt.state.clear()  # a fresh start: no primed moments
        return 0
    step, state = got
    model.load_state_dict(state["model"])
    optim = state["optim"]
    optim["state"] = {int(k): v for k, v in optim["state"].items()}
    optim["param_groups"] = opt.state_dict()["param_groups"]  # lr follows this world size
    opt.load_state_dict(optim)
    source = getattr(ckpt, "last_load_source", None)
    print(f"[rank {dist.get_rank()}] resumed at step {step} from {source} (world {world})",
          file=sys.stderr, flush=True)  # fmt: skip
    return step


if __name__ == "__main__":
    sys.exit(main())
