"""A small training loop used by the checkpoint tests as a real process.

python -m tests.checkpoint.trainer DIR STEPS [--kill-after N] [--job J]
Prints "RESUMED <step> <source>" then "SAVED <step>" per step; with --kill-after it
SIGKILLs itself right after save(N) returns.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch

from argosy.checkpoint import FlashCheckpointer


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("steps", type=int)
    parser.add_argument("--kill-after", type=int, default=None)
    parser.add_argument("--job", default=None)
    args = parser.parse_args()
    model, opt = build()
    ckpt = FlashCheckpointer(args.directory, keep=2, job_id=args.job, linger_s=30)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "loop": {"step": -1}}
    start = 0
    restored = ckpt.load()
    if restored is not None:
        model.load_state_dict(restored[1]["model"])
        opt.load_state_dict(restored[1]["optim"])
        start = restored[1]["loop"]["step"] + 1
    weights = float(model[0].weight.detach().sum())
    print(f"RESUMED {start - 1} {weights:.6f} {ckpt.last_load_source}", flush=True)
    print(f"DECISION {ckpt.last_decision}", flush=True)
    gen = torch.Generator().manual_seed(1)
    for step in range(start, args.steps):
        x = torch.randn(32, 256, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        ckpt.before_optimizer_step()
        opt.step()
        opt.zero_grad()
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "loop": {"step": step}}
        ckpt.save(step, state)
        print(f"SAVED {step} {float(model[0].weight.detach().sum()):.6f}", flush=True)
        if args.kill_after == step:
            os.kill(os.getpid(), signal.SIGKILL)
    ckpt.wait()
    ckpt.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
