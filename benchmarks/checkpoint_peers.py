"""The peers of benchmarks/checkpoint.py: one function per checkpoint system, same contract.

`PEERS[name](state, work, repeats) -> dict` saves `state` (from `make_state`) `repeats`
times into the directory `work` and returns medians in seconds under the keys the driver
tabulates (`stall_s`, `durable_s`, `memory_restore_s`, `disk_restore_s`, ...) and, for
argosy and DLRover, per-pair ratios against a floor measured just before each save
(`*_pairs`, from `checkpoint_floors.pair_ratios`). A peer that cannot run here returns
`{"missing": why}`. Each runs alone in a worker process (the driver's `--worker`). Durable
saves of argosy and DLRover are bracketed: a disk floor before and after each
(`checkpoint_floors.bracket_ratios`), the disk settled before each timed write. Disk
restores read a cold page cache (`checkpoint_floors.evict` before each), for every peer.

- torch_save: `torch.save` to a file, then fsync.
- dcp_save: `torch.distributed.checkpoint.save` (no process group), then every file fsynced.
- dcp_async: DCP `async_save`, process executor, DCP's shared-memory stager.
- dlrover: DLRover 0.6.1 flash checkpoint (MEMORY saves to shm; DISK saves for durable).
- argosy: `argosy.checkpoint.FlashCheckpointer`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkpoint_floors import (
    bracket_ratios,
    bracket_writers,
    copy_buffer,
    copy_once,
    evict,
    floor_buffer,
    memmove_once,
    pair_ratios,
    settle_disk,
    settled_floor,
)

TENSOR_MB = 64


def make_state(gb: float, device: str = "cpu", tensor_mb: float = TENSOR_MB) -> dict[str, Any]:
    """`gb` of float32 tensors of `tensor_mb` each (a model's state has hundreds to
    thousands of tensors: `tensor_mb` 1 gives 1,024 a GB)."""
    import torch

    n = max(1, round(gb * 1024 / tensor_mb))
    numel = int(tensor_mb * (1 << 20)) // 4
    gen = torch.Generator(device=device).manual_seed(0)
    layers = {  # random bits: a disk or host that compresses must not favour a peer's bytes
        f"layer{i}.weight": torch.rand(numel, device=device, generator=gen) for i in range(n)
    }
    return {"model": layers, "loop": {"step": 0, "epoch": 1}}


def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state["model"].values())


def busy(seconds: float) -> None:
    """A stand-in for forward/backward: matmuls for about `seconds`."""
    import torch

    a = torch.randn(512, 512)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a * 1e-3)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fsync_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def copy_into(state: dict, loaded: dict) -> None:
    for k, t in state["model"].items():
        t.copy_(loaded["model"][k])


def on_device(state: dict) -> bool:
    return any(t.device.type != "cpu" for t in state["model"].values())


# -- peers (each runs in a worker process) -------------------------------------------


def peer_torch_save(state: dict, work: Path, repeats: int) -> dict:
    import torch

    stalls = []
    for r in range(repeats):
        path = work / f"ckpt{r}.pt"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        stalls.append(time.perf_counter() - t0)
        if r:
            (work / f"ckpt{r - 1}.pt").unlink()
    loads = []
    for _ in range(repeats):
        evict(path)
        t0 = time.perf_counter()
        copy_into(state, torch.load(path, weights_only=True))
        loads.append(time.perf_counter() - t0)
    return {"stall_s": med(stalls), "durable_s": med(stalls), "disk_restore_s": med(loads)}


def peer_dcp_save(state: dict, work: Path, repeats: int) -> dict:
    import torch.distributed.checkpoint as dcp

    stalls = []
    for r in range(repeats):
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=str(work / f"s{r}"), no_dist=True)
        fsync_tree(work / f"s{r}")
        stalls.append(time.perf_counter() - t0)
        if r:
            shutil.rmtree(work / f"s{r - 1}")
    loads = []
    for _ in range(repeats):
        evict(work / f"s{repeats - 1}")
        t0 = time.perf_counter()
        dcp.load(state, checkpoint_id=str(work / f"s{repeats - 1}"), no_dist=True)
        loads.append(time.perf_counter() - t0)
    return {"stall_s": med(stalls), "durable_s": med(stalls), "disk_restore_s": med(loads)}


def peer_dcp_async(state: dict, work: Path, repeats: int) -> dict:
    """DCP async_save with the process executor and DCP's own stager, set up for where the
    state lives: device state needs a CPU backend in the process group (async_save asserts
    it), and is staged into pinned shared host memory on a background thread; the stall is
    the call plus the wait for that staging (the loop may then change the tensors)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    device = on_device(state)
    backend = "cpu:gloo,cuda:nccl" if device else "gloo"
    store = f"file://{work / 'store'}"
    dist.init_process_group(backend, init_method=store, rank=0, world_size=1)
    stager = DefaultStager(
        StagingOptions(
            use_pinned_memory=device,
            use_shared_memory=True,
            use_async_staging=device,
            use_non_blocking_copy=device,
        )
    )
    stalls, durables = [], []
    try:
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            resp = dcp.async_save(
                state,
                checkpoint_id=str(work / f"a{r}"),
                async_stager=stager,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
            )
            staged = getattr(resp, "staging_completion", None)
            if staged is not None:
                staged.result()
            stall = time.perf_counter() - t0
            getattr(resp, "upload_completion", resp).result()
            fsync_tree(work / f"a{r}")
            if r:  # the first call starts the executor process and allocates the stage
                stalls.append(stall)
                durables.append(time.perf_counter() - t0)
            if r > 1:
                shutil.rmtree(work / f"a{r - 1}")
    finally:
        stager.close()
        dist.destroy_process_group()
    return {"stall_s": med(stalls), "durable_s": med(durables)}


def fsync_with_dir(path: Path) -> None:
    """fsync a new file, then its directory (where its name lives): what makes it durable."""
    fsync_tree(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dlrover_checkpointer(work: Path, attempts: int = 3) -> Any:
    """DLRover's DDP checkpointer. Its start-up can hang (seen here under load): the saver
    process's factory may miss the trainer's first message, and the trainer then waits
    for a socket that never comes. So each attempt gets 120 s (DLRover's own 60 s is also
    short for a saver that imports torch on a loaded machine), and a fresh run id (fresh
    sockets); the start-up is not timed. A stale saver is killed with the worker."""
    from dlrover.trainer.torch.flash_checkpoint import engine
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer

    wait = engine.wait_socket_server
    engine.wait_socket_server = lambda server, timeout=120: wait(server, timeout)
    for attempt in range(attempts):
        os.environ["TORCHELASTIC_RUN_ID"] = f"argosy-bench-{uuid.uuid4().hex[:8]}"
        try:
            return DdpCheckpointer(str(work))
        except TimeoutError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def peer_dlrover(state: dict, work: Path, repeats: int) -> dict:
    """DLRover 0.6.1: MEMORY saves (the stall), then DISK saves paired with disk floors.

    A DISK save copies the state into shared memory, and DLRover's saver process writes it
    with `torch.save` to the path given (`work/{step}.pt`, the state plus ~4 KB of zip
    framing) and fsyncs only its tracker file (`dlrover_latest.txt`): `durable_s` is the
    save call to the tracker naming the step, with the state still in the page cache.
    `synced_s` adds what makes the state itself durable: an fsync of that file and of its
    directory, timed from the same save call. Each DISK save is bracketed by two floors;
    the step two back is deleted between the save and the second floor (where argosy's
    prune falls), outside the timing, so each holds two steps when a bracket starts."""
    try:
        from dlrover.trainer.torch.flash_checkpoint.ddp import StorageType

        ckpt = _dlrover_checkpointer(work)
    except ImportError as err:
        return {"missing": f"dlrover not installed ({err}); pip install -e '.[bench]'"}
    stalls, durables, mem_loads = [], [], []
    tensors, dst = list(state["model"].values()), None
    stall_pairs, durable_pairs = [], []
    synced, synced_pairs, fsyncs, file_bytes = [], [], [], []
    for r in range(repeats + 1):
        floor = copy_once(tensors, dst) if r else 0.0
        t0 = time.perf_counter()
        ckpt.save_checkpoint(r, state, str(work / f"{r}.pt"), storage_type=StorageType.MEMORY)
        stall = time.perf_counter() - t0
        if r:  # the first save allocates the shared memory and starts the saver
            stalls.append(stall)
            stall_pairs.append((floor, stall))
        else:
            dst = copy_buffer(tensors)
    buffer, writers = floor_buffer(nbytes(state)), bracket_writers()
    tracker = work / "dlrover_latest.txt"
    for r in range(repeats + 1, 2 * repeats + 1):
        floor = settled_floor(work / "floor.bin", buffer, writers)  # the bracket's first
        settle_disk()
        t0 = time.perf_counter()
        ckpt.save_checkpoint(r, state, str(work / f"{r}.pt"), storage_type=StorageType.DISK)
        while not (tracker.exists() and tracker.read_text().strip() == str(r)):
            time.sleep(0.002)
        durables.append(time.perf_counter() - t0)
        written = work / f"{r}.pt"
        file_bytes.append(written.stat().st_size)  # raises if DLRover wrote elsewhere
        fsync_with_dir(written)
        synced.append(time.perf_counter() - t0)
        fsyncs.append(synced[-1] - durables[-1])
        (work / f"{r - 2}.pt").unlink(missing_ok=True)  # keeps two steps, as argosy prunes
        after = settled_floor(work / "floor.bin", buffer, writers)
        durable_pairs.append((floor, durables[-1], after))
        synced_pairs.append((floor, synced[-1], after))
    for _ in range(repeats):
        t0 = time.perf_counter()
        loaded = ckpt.load_checkpoint()
        copy_into(state, loaded)
        mem_loads.append(time.perf_counter() - t0)
    return {
        "stall_s": med(stalls),
        "durable_s": med(durables),
        "memory_restore_s": med(mem_loads),
        "stall_pairs": pair_ratios(stall_pairs),
        "durable_pairs": bracket_ratios(durable_pairs),
        "synced_s": med(synced),
        "synced_fsync_s": med(fsyncs),
        "synced_pairs": bracket_ratios(synced_pairs),
        "disk_brackets": durable_pairs,
        "file_bytes": max(file_bytes),
    }


def bench_job_prefix() -> str:
    """The job-name prefix of this worker's argosy checkpointers: a worker's clean-up
    removes only its own shared-memory slots, never those of a worker running beside it."""
    return f"bench-{os.getpid()}-"


def bench_job() -> str:
    return f"{bench_job_prefix()}{uuid.uuid4().hex[:8]}"


def wait_pruned(work: Path, keep: int, timeout_s: float = 120.0) -> None:
    """Until argosy's persister has deleted the steps beyond `keep` (it prunes after the
    flush is answered): a floor written meanwhile would race that deletion for the disk."""
    from argosy.checkpoint import commit

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        names = [p.name for p in work.iterdir()]
        trash = [n for n in names if n.startswith(commit.TRASH_PREFIX)]
        if not trash and len(commit.committed_steps(work)) <= keep:
            return
        time.sleep(0.005)
    raise TimeoutError(f"argosy kept more than {keep} steps in {work} for {timeout_s} s")


def peer_argosy(state: dict, work: Path, repeats: int) -> dict:
    from argosy.checkpoint import FlashCheckpointer

    job = bench_job()
    free = shutil.disk_usage("/dev/shm").free
    slots = 2 if free > 2.5 * nbytes(state) else 1
    ckpt = FlashCheckpointer(work, keep=2, job_id=job, slots=slots)
    ckpt.save(0, state)  # first save: storages move to shared memory, slots are allocated
    ckpt.wait()
    stalls, overlapped, durables, persists, mem_loads = [], [], [], [], []
    tensors = list(state["model"].values())
    dst = copy_buffer(tensors)
    stall_pairs, durable_pairs, persist_pairs, memmove_pairs = [], [], [], []
    for r in range(1, repeats + 1):
        wait_pruned(work, keep=2)  # the last save's cleanup (an unlink) is not this one's
        alone = memmove_once(tensors, dst)  # the persister's copy alone, here
        floor = copy_once(tensors, dst)  # the pair's memcpy floor, this very moment
        t0 = time.perf_counter()
        ckpt.save(r, state)
        ckpt.before_optimizer_step()
        stalls.append(time.perf_counter() - t0)
        stall_pairs.append((floor, stalls[-1]))
        if alone is not None:
            memmove_pairs.append((alone, stalls[-1]))
        ckpt.wait()
    del dst
    copy_s = med(stalls)
    for r in range(repeats + 1, 2 * repeats + 1):
        t0 = time.perf_counter()
        ckpt.save(r, state)
        stall = time.perf_counter() - t0
        busy(2 * copy_s)  # the next step's forward/backward
        t1 = time.perf_counter()
        ckpt.before_optimizer_step()
        overlapped.append(stall + time.perf_counter() - t1)
        ckpt.wait()
    buffer, writers = floor_buffer(nbytes(state)), bracket_writers()
    floors = []
    for r in range(2 * repeats + 1, 3 * repeats + 1):
        wait_pruned(work, keep=2)
        before = settled_floor(work / "floor.bin", buffer, writers)  # the bracket's first
        settle_disk()
        t0 = time.perf_counter()
        ckpt.save(r, state)
        ckpt.wait()  # a durable save: save, then wait (the fence is wait's own first step)
        durables.append(time.perf_counter() - t0)
        persists.append(durables[-1] - ckpt.last_copy_s)  # from the snapshot in memory on
        wait_pruned(work, keep=2)  # the prune after the flush, as before the first floor
        after = settled_floor(work / "floor.bin", buffer, writers)
        floors += [before, after]
        durable_pairs.append((before, durables[-1], after))
        persist_pairs.append((before, persists[-1], after))
    for _ in range(repeats):
        t0 = time.perf_counter()
        ckpt.load(into=state)
        mem_loads.append(time.perf_counter() - t0)
    ckpt.close()
    reader = FlashCheckpointer(work, job_id=job, prestart=False)
    disk_loads = []
    for _ in range(repeats):
        evict(work)
        t0 = time.perf_counter()
        reader.load(into=state)
        disk_loads.append(time.perf_counter() - t0)
    reader.close()
    return {
        "stall_s": med(stalls),
        "stall_overlap_s": med(overlapped),
        "durable_s": med(durables),
        "persist_s": med(persists),
        "disk_floor_s": med(floors),  # around the durable saves
        "memory_restore_s": med(mem_loads),
        "disk_restore_s": med(disk_loads),
        "slots": slots,
        "stall_pairs": pair_ratios(stall_pairs),
        "memmove_stall_pairs": pair_ratios(memmove_pairs),
        "durable_pairs": bracket_ratios(durable_pairs),
        "persist_pairs": bracket_ratios(persist_pairs),
        "disk_brackets": durable_pairs,
        "writers": writers,
    }


PEERS: dict[str, Callable[[dict, Path, int], dict]] = {
    "torch_save": peer_torch_save,
    "dcp_save": peer_dcp_save,
    "dcp_async": peer_dcp_async,
    "dlrover": peer_dlrover,
    "argosy": peer_argosy,
}
"""Every peer by name, in the order the driver runs them."""
