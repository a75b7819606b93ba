"""A job without torch that reports its steps to `argosy launch` through the runtime hooks,
so the launcher's event log (`events.jsonl`) has steps, checkpoints and resumes.

Each step sleeps `--step-s`; every `--ckpt-every` steps the step is written to
`<run dir>/ckpt.txt` (and reported as a checkpoint, committed at once), and a new start
resumes after it. `--raise-at N` raises an exception at step N (a traceback, exit 1).
"""

import argparse
import os
import time
from pathlib import Path

from argosy.runtime import hooks

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--step-s", type=float, default=0.05)
p.add_argument("--ckpt-every", type=int, default=5)
p.add_argument("--raise-at", type=int, default=0)
args = p.parse_args()
run_dir = Path(os.environ.get("ARGOSY_RUN_DIR", "."))
ckpt = run_dir / "ckpt.txt"
start = int(ckpt.read_text()) if ckpt.exists() else 0
rt = hooks.attach()
rt.restored(start, target_step=args.steps)
for step in range(start + 1, args.steps + 1):
    rt.step_begin(step)
    with rt.compute():
        time.sleep(args.step_s)
    if step == args.raise_at:
        raise RuntimeError(f"the loss exploded at step {step}")
    rt.step_end(step, 1.0 / step)
    print(f"step {step}", flush=True)
    if step % args.ckpt_every == 0:
        with rt.checkpointing(step):
            tmp = run_dir / f"ckpt.{os.getpid()}.tmp"
            tmp.write_text(str(step))
            tmp.replace(ckpt)
        rt.committed(step)
rt.finish()
