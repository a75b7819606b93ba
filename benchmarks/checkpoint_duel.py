"""argosy's durable save against DLRover's with its file fsynced, in one process, in turns.

    PYTHONPATH=/tmp/dl .venv/bin/python benchmarks/checkpoint.py --sizes-gb 1 --repeats 7 \\
        --loop-steps 0 --peers duel

The two peers of checkpoint_peers.py run in separate workers, minutes apart, and on a
shared machine the disk floor swings more between minutes than the gap between them. Here
both checkpointers hold the same state in one worker, and each round runs, in an order
that alternates between rounds: [floor, DLRover DISK save + fsync of its file and
directory, floor] and [floor, argosy save to durable, floor]. Each save is timed from its
call and bracketed by the floors written just before and after it (the disk settled
before each timed write, `checkpoint_floors.bracket_ratios`); the round's two saves also
compare directly (`argosy / DLRover`, seconds apart). Each peer's disk holds its two
newest steps when its bracket starts, and deletes the step two back between the save and
the second floor (argosy prunes after answering the flush; DLRover's older file is
deleted here, untimed).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from checkpoint_floors import (
    bracket_ratios,
    bracket_writers,
    floor_buffer,
    settle_disk,
    settled_floor,
)
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
        ckpt.wait()  # a durable save: save, then wait
        return time.perf_counter() - t0

    return save, ckpt.close


def duel(state: dict, work: Path, repeats: int, paired: bool = True) -> dict:
    """Rounds of both peers' durable saves, each bracketed by floors (always paired: the
    floors are the point of the duel; `paired` is the peers' common signature)."""
    try:
        dl_save = _dlrover_saver(state, work / "dlrover")
    except ImportError as err:
        return {"missing": f"dlrover not installed ({err}); pip install -e '.[bench]'"}
    ar_save, close = _argosy_saver(state, work / "argosy")
    buffer, writers = floor_buffer(nbytes(state)), bracket_writers()
    dl_brackets, ar_brackets, rounds = [], [], []

    def floor() -> float:
        return settled_floor(work / "floor.bin", buffer, writers)

    def dl_turn(step: int) -> tuple[float, float, float]:
        before = floor()
        settle_disk()
        saved = dl_save(step)
        (work / "dlrover" / f"{step - 2}.pt").unlink(missing_ok=True)
        return before, saved, floor()

    def ar_turn(step: int) -> tuple[float, float, float]:
        before = floor()
        settle_disk()
        saved = ar_save(step)
        wait_pruned(work / "argosy", keep=2)
        return before, saved, floor()

    try:
        for step in range(1, repeats + 2):
            if step % 2:
                dl, ar = dl_turn(step), ar_turn(step)
            else:
                ar, dl = ar_turn(step), dl_turn(step)
            if step > 1:  # the first round warms both (DLRover's first disk write, argosy's)
                dl_brackets.append(dl)
                ar_brackets.append(ar)
                rounds.append((dl[1], ar[1]))
    finally:
        close()
    head_to_head = sorted(a / d for d, a in rounds)
    normalized = sorted(
        (a / (fa + ga)) / (d / (fd + gd))
        for (fd, d, gd), (fa, a, ga) in zip(dl_brackets, ar_brackets, strict=True)
    )
    return {
        "durable_s": statistics.median(a for _, a in rounds),
        "synced_s": statistics.median(d for d, _ in rounds),
        "disk_floor_s": statistics.median(
            f for b in dl_brackets + ar_brackets for f in (b[0], b[2])
        ),
        "durable_pairs": bracket_ratios(ar_brackets),
        "synced_pairs": bracket_ratios(dl_brackets),
        "head_to_head": head_to_head,
        "head_to_head_over_floors": normalized,
        "disk_brackets": {"argosy": ar_brackets, "dlrover": dl_brackets},
        "writers": writers,
    }
