"""Floors of benchmarks/checkpoint.py: what the hardware allows for the same bytes.

- memcpy floor: the state copied into a pre-touched host buffer; from device memory, into
  a pinned buffer (the device-to-host floor, `copy_floor_kind` "d2h_pinned"). torch's
  copy with the process's intra-op threads (as many as the cores; the persister copies
  with as many): what a trainer, or a peer, copies with.
- memmove floor (host state only): the persister's own copy (`memmove` in pieces, with
  non-temporal stores) in the worker itself, with no message around it; ~20% under the
  memcpy floor on the VM this was built on, so the least a snapshot in memory can cost.
- disk floor: the same byte count written sequentially from page-aligned memory to a
  fresh file on the checkpoint's file system and fsynced, the best of 1, 2 and 4 writers
  (each writing a contiguous range with 16 MiB `os.pwrite`s), each way: buffered (what
  `dd bs=16M conv=fsync` does) and with O_DIRECT (`oflag=direct`), the faster of the two
  (direct I/O was 1.6x faster on the VM this was built on): the least any durable save
  of this state can take on this disk.

Both are measured inside each peer's worker process, just before the peer runs, so a
peer and its floors see the same moment of a shared machine; the headline ratios come
from pairs instead (`pair_ratios`): a floor measured right before each save, and the
median of the per-pair ratios. For durable saves, a floor on both sides of each save
(`bracket_ratios`: floor, save, floor), the save over the two floors' mean (the disk's
speed at the save's moment, however it drifts between them) and over the faster of the
two (the strict lower bound), so that one slow floor can neither flatter nor punish it.

Before each timed disk write (a floor or a save) the disk is settled (`settle_disk`:
`sync()`, then a wait until it has nothing in flight), so no timed write shares the disk
with writeback left by the one before it. The floors of a bracket are written with the
writer count of argosy's shard writer (`pwrite.default_writers()`, like for like); the
worker's start-up floor (`disk_floor`) records the best of 1, 2 and 4 writers beside it.
What the `discard` mount option costs was measured (checkpoint_probe.py `discard`): the
trim of a deleted 1 GB file runs inside its `unlink` (1,024 MB discarded during the call,
none during the next floor), which no floor or save times.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from argosy.checkpoint.pwrite import DIRECT_ALIGN, direct_io_works

DISK_WRITERS = (1, 2, 4)
DISK_CHUNK = 16 << 20


def copy_buffer(tensors: list[Any]) -> Any:
    """A host buffer of the tensors' total size, every page touched (pinned for device
    tensors): where `copy_once` copies to."""
    import torch

    total = sum(t.numel() * t.element_size() for t in tensors)
    on_device = any(t.device.type != "cpu" for t in tensors)
    dst = torch.empty(total, dtype=torch.uint8, pin_memory=on_device)
    dst.fill_(1)
    return dst


def copy_once(tensors: list[Any], dst: Any) -> float:
    """Seconds to copy `tensors` into `dst` back to back (torch's copy, with the process's
    intra-op threads: the same threads and kernel a snapshot's copy uses)."""
    import torch

    on_device = any(t.device.type != "cpu" for t in tensors)
    t0 = time.perf_counter()
    off = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        dst[off : off + n].view(t.dtype).view(t.shape).copy_(t, non_blocking=on_device)
        off += n
    if on_device:
        torch.accelerator.synchronize()
    return time.perf_counter() - t0


def memmove_once(tensors: list[Any], dst: Any) -> float | None:
    """Seconds for the persister's own copy of host `tensors` into `dst` back to back (its
    plan, `pieces.plan_pieces`: 16 MiB `memmove`s taken by `copy_threads()` threads), in
    this process, with no message around it; None for device tensors. The driver starts
    its workers with the persister's glibc tunable (non-temporal stores, launch.py), so
    this is the fastest host copy known here: what a stall would be if it cost nothing but
    its copy."""
    from argosy.checkpoint.layout import TensorEntry
    from argosy.checkpoint.pieces import copy_pieces, plan_pieces

    if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        return None
    entries, off = [], 0
    for i, t in enumerate(tensors):  # where `copy_once` puts them, not the slot's alignment
        n, shape = t.numel() * t.element_size(), tuple(t.shape)
        entries.append(TensorEntry(f"t{i}", t.dtype, shape, off, n, shape, (0,) * t.dim(), False))
        off += n
    pieces = plan_pieces(dst, entries, {}, tensors)
    t0 = time.perf_counter()
    copy_pieces(pieces, lambda piece: None)
    return time.perf_counter() - t0


def memcpy_floor(tensors: list[Any], repeats: int) -> float:
    """Median seconds to copy `tensors` into one pre-touched host buffer."""
    dst = copy_buffer(tensors)
    times = [copy_once(tensors, dst) for _ in range(repeats + 1)]
    return statistics.median(times[1:])


def copy_floor_kind(tensors: list[Any]) -> str:
    """What `memcpy_floor` measures for these tensors: a host memcpy, or a device-to-host
    copy into pinned memory (the least a snapshot of device state can stall for)."""
    on_device = any(t.device.type != "cpu" for t in tensors)
    return "d2h_pinned" if on_device else "memcpy"


def pair_ratios(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Per-pair ratios (figure / its floor, each pair measured back to back): the median
    and the spread (lowest, highest). On a shared machine the floor itself swings more
    between minutes than a gap between figures; within a pair both see the same minute."""
    ratios = sorted(figure / floor for floor, figure in pairs if floor > 0)
    if not ratios:
        return {}
    return {"median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1],
            "pairs": len(ratios)}  # fmt: skip


DISK = os.environ.get("BENCH_DISK", "vda")
"""The block device of the checkpoint's file system, as /proc/diskstats names it."""


def disk_counters() -> dict[str, int]:
    """The disk's cumulative counters (0 where it is not found): bytes written, bytes
    discarded, writes and discards in flight."""
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if len(f) >= 17 and f[2] == DISK:
            return {"written": int(f[9]) * 512, "discarded": int(f[16]) * 512,
                    "in_flight": int(f[11])}  # fmt: skip
    return {"written": 0, "discarded": 0, "in_flight": 0}


def settle_disk(quiet_s: float = 0.2, timeout_s: float = 3.0) -> float:
    """`sync()`, then wait until the disk has nothing in flight and its written and
    discarded bytes have not moved for `quiet_s`, at most `timeout_s` (other processes
    may write all along); returns the seconds waited. Not part of any timing."""
    t0 = time.perf_counter()
    os.sync()
    last, still = disk_counters(), time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        time.sleep(0.02)
        now = disk_counters()
        if now != last or now["in_flight"]:
            last, still = now, time.perf_counter()
        elif time.perf_counter() - still >= quiet_s:
            break
    return time.perf_counter() - t0


def bracket_ratios(brackets: list[tuple[float, float, float]]) -> dict[str, Any]:
    """Per-save ratios from (floor before, save, floor after), each taken back to back:
    `pair_ratios` of the save over the mean of its two floors (the headline), and the
    same over the faster floor, the floor before, the floor after; `drift`: floor after
    over floor before (1.0 when the disk kept its speed across the save)."""
    out: dict[str, Any] = dict(pair_ratios([((a + b) / 2, s) for a, s, b in brackets]))
    if out:
        out["over_faster"] = pair_ratios([(min(a, b), s) for a, s, b in brackets])
        out["over_before"] = pair_ratios([(a, s) for a, s, _ in brackets])
        out["over_after"] = pair_ratios([(b, s) for _, s, b in brackets])
        out["drift"] = pair_ratios([(a, b) for a, _, b in brackets])
    return out


def write_phases(
    path: Path, buffer: memoryview, writers: int, direct: bool = False
) -> tuple[float, float]:
    """Write `buffer` to `path` with `writers` threads in DISK_CHUNK pieces, then fsync it;
    returns (write seconds, fsync seconds). The file is left in place. `direct`: with
    O_DIRECT (`buffer` page-aligned, see floor_buffer), a tail under 4 KiB buffered."""
    size = buffer.nbytes
    per = -(-size // writers // DISK_CHUNK) * DISK_CHUNK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    out = os.open(path, os.O_WRONLY | os.O_DIRECT) if direct else fd
    aligned = size // DIRECT_ALIGN * DIRECT_ALIGN if direct else size
    try:
        t0 = time.perf_counter()

        def write(start: int) -> None:
            for at in range(start, min(aligned, start + per), DISK_CHUNK):
                os.pwrite(out, buffer[at : min(aligned, at + DISK_CHUNK)], at)

        threads = [threading.Thread(target=write, args=(s,)) for s in range(0, size, per)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if aligned < size:
            os.pwrite(fd, buffer[aligned:], aligned)
        t1 = time.perf_counter()
        os.fsync(fd)
        return t1 - t0, time.perf_counter() - t1
    finally:
        if out != fd:
            os.close(out)
        os.close(fd)


def write_once(path: Path, buffer: memoryview, writers: int, direct: bool = False) -> float:
    """Seconds to write and fsync `buffer` (write_phases), the file removed afterwards."""
    try:
        return sum(write_phases(path, buffer, writers, direct))
    finally:
        path.unlink(missing_ok=True)


def evict(path: Path) -> None:
    """Drop `path`'s files (a file or a tree, already synced) from the page cache, so a
    timed restore reads the disk, as after a restart on another machine, whichever way
    (buffered or direct) the peer wrote them."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # only clean pages can be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def floor_buffer(size: int) -> memoryview:
    """`size` bytes of incompressible data to write, page-aligned (for direct I/O)."""
    import mmap

    import numpy as np

    populate = getattr(mmap, "MAP_POPULATE", 0)  # its pages faulted in at once: ~40% less
    arena = mmap.mmap(-1, max(1, size), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | populate)
    view = memoryview(arena)
    block = np.frombuffer(os.urandom(1 << 20), dtype=np.uint8)
    whole = size // block.size * block.size
    # one broadcast copy, not a Python loop of 1 MiB slices (8 GB: 8,192 of them, seconds)
    np.frombuffer(arena, dtype=np.uint8, count=whole).reshape(-1, block.size)[:] = block
    view[whole:size] = block[: size - whole].tobytes()
    return view[:size]


def disk_floor(
    size: int,
    work: Path,
    repeats: int,
    writer_counts: tuple[int, ...] = DISK_WRITERS,
    direct_only: bool = False,
) -> dict[str, Any]:
    """Best median over writer counts (and buffered or direct) of write + fsync of `size`
    bytes into `work`. `direct_only`: O_DIRECT alone where the file system takes it (the
    faster way on both hosts measured: 1.6x on the VM this was built on, 1.7x on a lent
    H200's; each way of an 8 GB state is seconds of writing)."""
    view = floor_buffer(size)
    direct = direct_io_works(work)
    ways = [True] if direct and direct_only else [False, True] if direct else [False]
    runs: dict[tuple[int, bool], list[float]] = {(w, d): [] for w in writer_counts for d in ways}
    for _ in range(max(1, repeats)):  # interleaved, so drift hits every writer count alike
        for writers, direct in runs:
            runs[writers, direct].append(write_once(work / "floor.bin", view, writers, direct))
    medians = {key: statistics.median(ts) for key, ts in runs.items()}
    best = min(medians, key=medians.__getitem__)
    by_writers = {f"{w}{' direct' if d else ''}": t for (w, d), t in medians.items()}
    return {"disk_floor_s": medians[best], "disk_floor_writers": best[0],
            "disk_floor_direct": best[1], "disk_floor_by_writers": by_writers}  # fmt: skip


def bracket_writers() -> int:
    """The writer count of a bracket's floors: that of argosy's shard writer."""
    from argosy.checkpoint import pwrite

    return pwrite.default_writers()


def settled_floor(path: Path, buffer: memoryview, writers: int) -> float:
    """A disk floor on a settled disk: the faster of a buffered and (where the file system
    allows it) a direct `write_once`, each on a settled disk."""
    settle_disk()
    best = write_once(path, buffer, writers)
    if direct_io_works(path.parent):
        settle_disk()
        best = min(best, write_once(path, buffer, writers, direct=True))
    return best
