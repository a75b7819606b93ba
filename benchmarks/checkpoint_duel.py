"""argosy's durable save against DLRover's with its file fsynced, in one process, in turns.

    PYTHONPATH=/tmp/dl .venv/bin/python benchmarks/checkpoint.py --sizes-gb 1 --repeats 7 \\
        --loop-steps 0 --peers duel

The two peers of checkpoint_peers.py run in separate workers, minutes apart, and on a
shared machine the disk floor swings more between minutes than the gap between them. Here
both checkpointers hold the same state in one worker, and each round runs, in an order
that alternates between rounds: [a disk floor, DLRover DISK save + fsync of its file and
directory] and [a disk floor, argosy save to durable]. Each save is timed from its call;
each is paired with the floor written just before it, and the round's two saves compare
directly (`argosy / DLRover`, seconds apart). Before each floor, each peer's disk holds
its two newest steps only (argosy prunes after answering the flush; DLRover's older files
are deleted here, untimed), so every write lands in page cache freed just before it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from checkpoint_floors import floor_buffer, pair_ratios, write_once
from checkpoint_peers import (
    _dlrover_checkpointer,
    bench_job,
    fsync_with_dir,
    nbytes,
    wait_pruned,
)


def _dlrover_saver(state: dict, work: Path) -> Callable[[int], float]:
    """One DLRover DISK save of `state` per call, timed to its file fsynced."""
    from dlrover.trainer.torch.flash_checkpoint.ddp import StorageType

    work.mkdir()
    ckpt = _dlrover_checkpointer(work)
    ckpt.save_checkpoint(0, state, str(work / "0.pt"), storage_type=StorageType.MEMORY)
    tracker = work / "dlrover_latest.txt"

    def save(step: int) -> float:
        t0 = time.perf_counter()
        ckpt.save_checkpoint(step, state, str(work / f"{step}.pt"), storage_type=StorageType.DISK)
        while not (tracker.exists() and tracker.read_text().strip() == str(step)):
            time.sleep(0.002)
        fsync_with_dir(work / f"{step}.pt")
        return time.perf_counter() - t0

    return save


def _argosy_saver(state: dict, work: Path) -> tuple[Callable[[int], float], Callable[[], None]]:
    """One argosy save of `state` per call, timed to durable; and its close."""
    from argosy.checkpoint import FlashCheckpointer

    work.mkdir()
    slots = 2 if shutil.disk_usage("/dev/shm").free > 4 * nbytes(state) else 1
    ckpt = FlashCheckpointer(work, keep=2, job_id=bench_job(), slots=slots)
    ckpt.save(0, state)  # storages move to shared memory, slots are allocated
    ckpt.wait()

    def save(step: int) -> float:
        t0 = time.perf_counter()
        ckpt.save(step, state)
        ckpt.before_optimizer_step()
        ckpt.wait()
        return time.perf_counter() - t0

    return save, ckpt.close


def duel(state: dict, work: Path, repeats: int) -> dict:
    try:
        dl_save = _dlrover_saver(state, work / "dlrover")
    except ImportError as err:
        return {"missing": f"dlrover not installed ({err}); pip install -e '.[bench]'"}
    ar_save, close = _argosy_saver(state, work / "argosy")
    buffer, writers = floor_buffer(nbytes(state)), int(os.environ["BENCH_FLOOR_WRITERS"])
    dl_pairs, ar_pairs, rounds = [], [], []

    def dl_turn(step: int) -> tuple[float, float]:
        (work / "dlrover" / f"{step - 2}.pt").unlink(missing_ok=True)
        floor = write_once(work / "floor.bin", buffer, writers)
        return floor, dl_save(step)

    def ar_turn(step: int) -> tuple[float, float]:
        wait_pruned(work / "argosy", keep=2)
        floor = write_once(work / "floor.bin", buffer, writers)
        return floor, ar_save(step)

    try:
        for step in range(1, repeats + 2):
            if step % 2:
                dl, ar = dl_turn(step), ar_turn(step)
            else:
                ar, dl = ar_turn(step), dl_turn(step)
            if step > 1:  # the first round warms both (DLRover's first disk write, argosy's)
                dl_pairs.append(dl)
                ar_pairs.append(ar)
                rounds.append((dl[1], ar[1]))
    finally:
        close()
    head_to_head = sorted(a / d for d, a in rounds)
    normalized = sorted(
        (a / fa) / (d / fd) for (fd, d), (fa, a) in zip(dl_pairs, ar_pairs, strict=True)
    )
    return {
        "durable_s": statistics.median(a for _, a in rounds),
        "synced_s": statistics.median(d for d, _ in rounds),
        "disk_floor_s": statistics.median(f for f, _ in dl_pairs + ar_pairs),
        "durable_pairs": pair_ratios(ar_pairs),
        "synced_pairs": pair_ratios(dl_pairs),
        "head_to_head": head_to_head,
        "head_to_head_over_floors": normalized,
    }
