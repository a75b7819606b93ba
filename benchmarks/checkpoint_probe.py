"""Probes behind the checkpoint benchmark's pairing (RESULTS.md, issue 15, durable saves).

    PYTHONPATH=/tmp/dl .venv/bin/python benchmarks/checkpoint_probe.py dlrover --n 4 --writers 4
    .venv/bin/python benchmarks/checkpoint_probe.py page-cache --n 4 --writers 4

`dlrover`: what DLRover 0.6.1's DISK save writes (paths, byte counts) and when its bytes
reach the disk (`/proc/diskstats` of the root disk, `vda` here, and `/proc/meminfo`'s
Dirty around each phase), next to two floors (incompressible bytes; the state's own).
`page-cache`: a 1 GB write+fsync whose page cache must grow, against one written right
after a 1 GB file was unlinked (both phases timed): why a pair's floor and its save must
see the same deletions.
`discard`: a 1 GB floor right after a 1 GB fsynced file was unlinked, against one after
the same unlink once the disk is settled (`settle_disk`: sync, trims done), with the
bytes the disk wrote and discarded during each phase: what the `discard` mount option
costs the write that follows a deletion.

    .venv/bin/python benchmarks/checkpoint_probe.py discard --n 4 --writers 2

`source`: the same 1 GB written and fsynced four ways in turns, the disk settled before
each: the floor (`write_once` from private memory), the floor's writer from a shared-memory
file (where argosy's slots live), argosy's own writer (`pwrite.write_parallel`, 16 MiB
chunks in file order, checksummed beside the fsync) from that file, and the floor again:
whether the source memory or argosy's write path, not its persister, beats the floor.

    .venv/bin/python benchmarks/checkpoint_probe.py source --n 4 --writers 2

`nice`: argosy saves of a 1 GB state in the benchmark's pattern (save, fence, `wait()` at
once), the persister's threads sampled with `ps -L` every 20 ms: how many run at each nice
level while the trainer waits (a write left below the job shows threads at its nice + 10).
Run it under `nice -n 10` as the benchmark runs, with PYTHONPATH naming the tree to probe
and a working directory outside the repository (the persister runs `python -m`).

    cd /tmp && PYTHONPATH=<tree> nice -n 10 <repo>/.venv/bin/python \
        <repo>/benchmarks/checkpoint_probe.py nice --n 4

`stall`: saves each right after the memcpy floor (the benchmark's stall pair), the stall
and the persister's copy over that floor; run as is and under OMP_WAIT_POLICY=passive
(the trainer's idle OpenMP workers then sleep instead of spinning beside the copy).

    cd /tmp && OMP_WAIT_POLICY=passive PYTHONPATH=<tree> nice -n 10 <repo>/.venv/bin/python \
        <repo>/benchmarks/checkpoint_probe.py stall --n 11 [--tensor-mb 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from checkpoint_floors import (
    disk_counters,
    floor_buffer,
    settle_disk,
    write_once,
    write_phases,
)
from checkpoint_peers import make_state, nbytes

DISK = os.environ.get("BENCH_DISK", "vda")


def sectors() -> int:
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == DISK:
            return int(f[9]) * 512
    return 0


def meminfo() -> dict:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":")
        if k in ("Dirty", "Writeback"):
            out[k] = int(v.split()[0]) * 1024
    return out


def listing(work: Path) -> dict:
    return {str(p.relative_to(work)): p.stat().st_size for p in work.rglob("*") if p.is_file()}


def dlrover_phases(n: int, writers: int) -> None:
    """`n` DLRover DISK saves of a 1 GiB state, each after two floors (incompressible
    bytes, then the state's own bytes): phase times, bytes on disk, the files written."""
    import torch
    from checkpoint import _clean_children_and_shm
    from checkpoint_peers import _dlrover_checkpointer
    from dlrover.trainer.torch.flash_checkpoint.ddp import StorageType

    shm_before = set(os.listdir("/dev/shm"))
    work = Path(tempfile.mkdtemp(prefix="argosy-bench-probe-"))
    state = make_state(1.0)
    size = nbytes(state)
    rand = floor_buffer(size)
    same = torch.cat([t.view(torch.uint8) for t in state["model"].values()]).numpy()
    same = memoryview(same).cast("B")
    ckpt = _dlrover_checkpointer(work)
    ckpt.save_checkpoint(1, state, str(work / "1.pt"), storage_type=StorageType.MEMORY)
    time.sleep(2)
    rows = []
    for r in range(2, 2 + n):
        s0 = sectors()
        f_rand = write_once(work / "floor.bin", rand, writers)
        s1 = sectors()
        f_same = write_once(work / "floor.bin", same, writers)
        s2 = sectors()
        m0 = meminfo()
        t0 = time.perf_counter()
        ckpt.save_checkpoint(r, state, str(work / f"{r}.pt"), storage_type=StorageType.DISK)
        t_call = time.perf_counter() - t0
        tracker = work / "dlrover_latest.txt"
        first = None
        while not (tracker.exists() and tracker.read_text().strip() == str(r)):
            if first is None and (work / f"{r}.pt").exists():
                first = time.perf_counter() - t0
            time.sleep(0.002)
        t_tracker = time.perf_counter() - t0
        s3 = sectors()
        m1 = meminfo()
        files = listing(work)
        fd = os.open(work / f"{r}.pt", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        t_sync = time.perf_counter() - t0
        s4 = sectors()
        rows.append(
            {
                "step": r,
                "floor_rand_s": round(f_rand, 3),
                "floor_rand_disk_mb": (s1 - s0) >> 20,
                "floor_same_bytes_s": round(f_same, 3),
                "floor_same_disk_mb": (s2 - s1) >> 20,
                "save_call_s": round(t_call, 3),
                "file_seen_s": first and round(first, 3),
                "tracker_s": round(t_tracker, 3),
                "synced_s": round(t_sync, 3),
                "disk_mb_before_fsync": (s3 - s2) >> 20,
                "disk_mb_in_fsync": (s4 - s3) >> 20,
                "dirty_mb_at_start": m0["Dirty"] >> 20,
                "dirty_mb_at_tracker": m1["Dirty"] >> 20,
                "writeback_mb_at_tracker": m1["Writeback"] >> 20,
                "files": {k: v for k, v in files.items() if k.endswith(f"{r}.pt") or "latest" in k},
                "state_bytes": size,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        (work / f"{r}.pt").unlink()
    shutil.rmtree(work, ignore_errors=True)
    _clean_children_and_shm(shm_before)  # DLRover's saver process and its shared memory


def small_fsync(path: Path) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, b"x")
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def page_cache(n: int, writers: int) -> None:
    """1 GB floors that grow the page cache against ones right after a 1 GB unlink."""
    work = Path(tempfile.mkdtemp(prefix="argosy-bench-floorprobe-"))
    buf = floor_buffer(1 << 30)
    kept = []
    for i in range(n):
        w, s = write_phases(work / f"grow{i}.bin", buf, writers)
        kept.append(work / f"grow{i}.bin")
        print(
            f"grow (nothing freed before)  write {w:.3f} fsync {s:.3f} total {w + s:.3f}",
            flush=True,
        )
        t0 = time.perf_counter()
        kept.pop(0).unlink()
        u = time.perf_counter() - t0
        w, s = write_phases(work / f"reuse{i}.bin", buf, writers)
        kept.append(work / f"reuse{i}.bin")
        print(
            f"reuse (1 GB unlinked before, {u:.3f} s) write {w:.3f} fsync {s:.3f}"
            f" total {w + s:.3f}",
            flush=True,
        )
    for p in work.iterdir():
        p.unlink()
    work.rmdir()


def discard(n: int, writers: int) -> None:
    """1 GB floors right after a 1 GB unlink, unsettled and settled, in turns."""
    work = Path(tempfile.mkdtemp(prefix="argosy-bench-discardprobe-"))
    buf = floor_buffer(1 << 30)
    try:
        for i in range(2 * n):
            settled = bool(i % 2)
            write_once(work / "old.bin", buf, writers)  # fsynced, then unlinked:
            settle_disk()  # its own trim done; now a fresh 1 GB deletion
            old = work / "old2.bin"
            write_phases(old, buf, writers)
            settle_disk()
            c = [disk_counters()]
            t0 = time.perf_counter()
            old.unlink()
            unlink_s = time.perf_counter() - t0
            c.append(disk_counters())
            waited = settle_disk() if settled else 0.0
            c.append(disk_counters())
            w, f = write_phases(work / "floor.bin", buf, writers)
            c.append(disk_counters())
            time.sleep(3)
            c.append(disk_counters())
            (work / "floor.bin").unlink()
            mb = {
                k: [(y[k] - x[k]) >> 20 for x, y in zip(c, c[1:], strict=False)]
                for k in ("written", "discarded")
            }
            print(json.dumps({
                "after_unlink": "settled" if settled else "at once",
                "unlink_s": round(unlink_s, 3), "settle_s": round(waited, 3),
                "write_s": round(w, 3), "fsync_s": round(f, 3), "total_s": round(w + f, 3),
                "mb_written_unlink_settle_floor_3s": mb["written"],
                "mb_discarded_unlink_settle_floor_3s": mb["discarded"],
            }), flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def source(n: int, writers: int) -> None:
    """1 GB: floor (private memory), floor from /dev/shm, argosy's writer from /dev/shm."""
    import mmap

    from argosy.checkpoint import fileplan, pwrite

    work = Path(tempfile.mkdtemp(prefix="argosy-bench-sourceprobe-"))
    buf = floor_buffer(1 << 30)
    shm_path = Path("/dev/shm") / f"argosy-bench-probe-{os.getpid()}"
    fd = os.open(shm_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, buf.nbytes)
        shm = mmap.mmap(fd, buf.nbytes)
        shm[:] = buf
        shared = memoryview(shm)

        def argosy_write() -> float:
            plan = fileplan.FilePlan()
            for at in range(0, shared.nbytes, 64 << 20):  # 64 MiB tensors, by reference
                plan.write(shared[at : at + (64 << 20)])
            t0 = time.perf_counter()
            pwrite.write_parallel(work / "argosy.bin", plan, writers)
            seconds = time.perf_counter() - t0
            (work / "argosy.bin").unlink()
            return seconds

        ways = {
            "floor": lambda: write_once(work / "floor.bin", buf, writers),
            "floor_from_shm": lambda: write_once(work / "floor.bin", shared, writers),
            "argosy_writer_from_shm": argosy_write,
            "floor_again": lambda: write_once(work / "floor.bin", buf, writers),
        }
        for _ in range(n):
            row = {}
            for name, way in ways.items():
                settle_disk()
                row[name] = round(way(), 3)
            print(json.dumps(row), flush=True)
    finally:
        os.close(fd)
        shm_path.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def nice_levels(n: int, writers: int) -> None:
    """`n` saves to durable; per save, samples of (threads at each nice level)."""
    import collections
    import subprocess
    import threading
    import uuid

    import psutil
    import torch

    from argosy.checkpoint import FlashCheckpointer

    del writers  # the persister's own
    gen = torch.Generator().manual_seed(0)
    state = {"model": {f"l{i}": torch.rand(16 << 20, generator=gen) for i in range(16)}}
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with tempfile.TemporaryDirectory(prefix="argosy-bench-niceprobe-") as work:
        ckpt = FlashCheckpointer(work, keep=2, job_id=f"niceprobe-{uuid.uuid4().hex[:8]}")
        ckpt.save(0, state)
        ckpt.wait()
        children = psutil.Process().children(recursive=True)
        pid = next(c.pid for c in children if "persister" in " ".join(c.cmdline()))
        for step in range(1, n + 1):
            seen: collections.Counter = collections.Counter()
            stop = threading.Event()

            def sample(seen: collections.Counter = seen, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    ps = ["ps", "-L", "-o", "ni=", "-p", str(pid)]
                    levels = subprocess.run(ps, capture_output=True, text=True).stdout.split()
                    seen[" ".join(f"{levels.count(v)}@{v}" for v in sorted(set(levels)))] += 1
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            t0 = time.perf_counter()
            ckpt.save(step, state)
            ckpt.before_optimizer_step()
            ckpt.wait()
            durable = time.perf_counter() - t0
            stop.set()
            sampler.join()
            print(json.dumps({"step": step, "job_nice": mine, "durable_s": round(durable, 3),
                              "samples_by_threads_at_nice": dict(seen)}), flush=True)  # fmt: skip
        ckpt.close()


def stall(n: int, writers: int, tensor_mb: int = 64) -> None:
    """`n` saves of a 1 GB state of `tensor_mb` MiB tensors, each right after the memcpy
    floor (the benchmark's pair): the stall (save + fence) and the persister's own copy,
    each over that floor. Run it once as is and once under OMP_WAIT_POLICY=passive: the
    difference is what the trainer's spinning OpenMP workers take from the copy."""
    import statistics
    import uuid

    import torch
    from checkpoint_floors import copy_buffer, copy_once

    from argosy.checkpoint import FlashCheckpointer

    del writers  # the persister's own
    count = 1024 // tensor_mb
    state = {"model": {f"w{i}": torch.randn((tensor_mb << 20) // 4) for i in range(count)}}
    tensors = list(state["model"].values())
    rows = []
    with tempfile.TemporaryDirectory(prefix="argosy-bench-stallprobe-") as work:
        ckpt = FlashCheckpointer(work, keep=2, job_id=f"stallprobe-{uuid.uuid4().hex[:8]}")
        ckpt.save(0, state)
        ckpt.wait()
        time.sleep(0.5)
        dst = copy_buffer(tensors)
        for step in range(1, n + 1):
            floor = copy_once(tensors, dst)
            t0 = time.perf_counter()
            ckpt.save(step, state)
            ckpt.before_optimizer_step()
            stalled = time.perf_counter() - t0
            rows.append((stalled / floor, ckpt.last_copy_s / floor))
            print(json.dumps({"step": step, "floor_s": round(floor, 4),
                              "stall_s": round(stalled, 4),
                              "copy_s": round(ckpt.last_copy_s, 4)}), flush=True)  # fmt: skip
            ckpt.wait()
        ckpt.close()
    summary = {
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "tensor_mb": tensor_mb,
        "stall_over_floor": round(statistics.median(r[0] for r in rows), 3),
        "copy_over_floor": round(statistics.median(r[1] for r in rows), 3),
    }
    print(json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "what", choices=["dlrover", "page-cache", "discard", "source", "nice", "stall"]
    )
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--tensor-mb", type=int, default=64, help="stall: tensor size")
    args = parser.parse_args()
    probes = {
        "dlrover": dlrover_phases,
        "page-cache": page_cache,
        "discard": discard,
        "source": source,
        "nice": nice_levels,
        "stall": lambda n, w: stall(n, w, args.tensor_mb),
    }
    probes[args.what](args.n, args.writers)


if __name__ == "__main__":
    main()
