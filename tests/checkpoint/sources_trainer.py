"""A trainer that dies right after the save of new storages, for test_ckpt_sources.py.

python tests/checkpoint/sources_trainer.py DIR JOB

Saves step 0 and waits for it, prints "PERSISTER <pid>", reads one line from stdin, then
saves step 1 from a tensor with a new storage, larger than `inline_bytes` (the persister
has not seen it: its file descriptor travels with that save), prints "SAVED 1" and SIGKILLs itself.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from argosy.checkpoint import FlashCheckpointer


def main() -> None:
    directory, job = sys.argv[1], sys.argv[2]
    ckpt = FlashCheckpointer(directory, keep=2, job_id=job, linger_s=30)
    ckpt.save(0, {"w": torch.zeros(256, 256)})
    ckpt.wait()
    print(f"PERSISTER {ckpt.persister_pid}", flush=True)
    sys.stdin.readline()
    ckpt.save(1, {"w": torch.full((256, 256), 1.0)})  # a new storage
    print("SAVED 1", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
