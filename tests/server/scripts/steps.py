"""A job without torch for the server tests: counts steps, checkpoints to a file.

Each step sleeps `--step-s`; every `ARGOSY_CHECKPOINT_EVERY` steps (default 1) the step
is written to `<run dir>/ckpt.txt`, and a new start resumes after it. Every start
appends "<pid> <first step>" to `<run dir>/starts.txt`, so a test sees how often and
from where the job ran. `--fail` exits 1 at once.
"""

import argparse
import os
import sys
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--step-s", type=float, default=0.05)
p.add_argument("--fail", action="store_true")
args = p.parse_args()
run_dir = Path(os.environ.get("ARGOSY_RUN_DIR", "."))
every = int(os.environ.get("ARGOSY_CHECKPOINT_EVERY", "1"))
ckpt = run_dir / "ckpt.txt"
start = int(ckpt.read_text()) if ckpt.exists() else 0
with (run_dir / "starts.txt").open("a") as f:
    f.write(f"{os.getpid()} {start + 1}\n")
print(f"start at step {start + 1}", flush=True)
if args.fail:
    print("failing on purpose", file=sys.stderr, flush=True)
    sys.exit(1)
for step in range(start + 1, args.steps + 1):
    time.sleep(args.step_s)
    print(f"step {step}", flush=True)
    if step % every == 0:
        tmp = run_dir / f"ckpt.{os.getpid()}.tmp"  # ranks share the run dir
        tmp.write_text(str(step))
        tmp.replace(ckpt)
