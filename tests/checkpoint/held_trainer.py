"""A trainer whose persister starts late, for the tests of snapshots held by the trainer.

python tests/checkpoint/held_trainer.py DIR JOB DELAY_S (save SIGNAL | load)

save: two saves (steps 0 and 1) while the persister, started `DELAY_S` late, has not
answered `ready` (so `HeldSlots` holds them), prints "HELD <step> <ready>" per save, then
sends itself SIGNAL (KILL or TERM: what the launcher sends a failed and a surviving rank).
load: prints "LOADED <step> <source> <w[0, 0]>" and closes (it starts no persister).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch

from argosy.checkpoint import FlashCheckpointer


def late_popen(delay_s: float) -> type[subprocess.Popen]:
    """A `subprocess.Popen` under which the persister sleeps `delay_s` before its imports:
    a start on a loaded machine. Install it as `subprocess.Popen` (or monkeypatch it in)."""
    real = subprocess.Popen

    class LatePopen(real):  # type: ignore[misc, valid-type]
        def __init__(self, args, **kwargs):  # noqa: ANN001, ANN003
            if list(args[1:3]) == ["-m", "argosy.checkpoint.persister"]:
                code = (
                    f"import runpy, time; time.sleep({delay_s}); "
                    "runpy.run_module('argosy.checkpoint.persister', run_name='__main__')"
                )
                args = [args[0], "-c", code, *args[3:]]
            super().__init__(args, **kwargs)

    return LatePopen


def main() -> None:
    directory, job, delay_s, mode = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    if delay_s > 0:
        subprocess.Popen = late_popen(delay_s)
    # load: no persister of its own (the test frees the slots), so the run stays short
    ckpt = FlashCheckpointer(directory, keep=2, job_id=job, linger_s=30, prestart=mode != "load")
    if mode == "load":
        got = ckpt.load()
        step, w = (None, None) if got is None else (got[0], float(got[1]["w"][0, 0]))
        print(f"LOADED {step} {ckpt.last_load_source} {w}", flush=True)
        ckpt.close()
        return
    w = torch.zeros(64, 1024)
    for step in range(2):
        w += 1
        ckpt.save(step, {"w": w, "step": step})
        print(f"HELD {step} {ckpt._ready}", flush=True)
    os.kill(os.getpid(), getattr(signal, f"SIG{sys.argv[5]}"))
    time.sleep(30)  # never reached: no handler for KILL or TERM


if __name__ == "__main__":
    main()
