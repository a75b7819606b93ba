"""The peers of benchmarks/checkpoint.py: one function per checkpoint system, same contract.

`PEERS[name](state, work, repeats, paired) -> dict` saves `state` (from `make_state`)
`repeats` times into the directory `work` and returns medians in seconds under the keys the
driver tabulates (`stall_s`, `durable_s`, `memory_restore_s`, `disk_restore_s`, ...) and,
for argosy and DLRover with `paired` (the driver's full mode), per-pair ratios against a
floor measured just before each save (`*_pairs`, from `checkpoint_floors.pair_ratios`). A
peer that cannot run here returns `{"missing": why}`. Each runs alone in a worker process
(the driver's `--worker`). With `paired`, durable saves of argosy and DLRover are
bracketed: a disk floor before and after each (`checkpoint_floors.bracket_ratios`), the
disk settled before each timed write; without (lean), argosy's durable figure comes from
its stall rounds' own saves, timed on to durable, and no floor is written between saves.
Disk restores read a cold page cache (`checkpoint_floors.evict` before each), for every
peer.

- torch_save: `torch.save` to a file, then fsync.
- dcp_save: `torch.distributed.checkpoint.save` (no process group), then every file fsynced.
- dcp_async: DCP `async_save`, process executor, DCP's shared-memory stager (a fresh one
  per save on torch 2.11, whose stager closes itself after a stage: `stager_spent`).
- dlrover: DLRover 0.6.1 flash checkpoint (MEMORY saves to shm; DISK saves for durable).
- argosy: `argosy.checkpoint.FlashCheckpointer`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
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
STARTED = time.perf_counter()


def progress(what: str) -> None:
    """A line on stderr as a phase of a worker ends: the driver shows the last one of a
    worker it had to stop (where the time went), and a worker run by hand shows all."""
    print(f"progress: {time.perf_counter() - STARTED:.1f} s, {what}", file=sys.stderr, flush=True)


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


def peer_torch_save(state: dict, work: Path, repeats: int, paired: bool = True) -> dict:
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


def peer_dcp_save(state: dict, work: Path, repeats: int, paired: bool = True) -> dict:
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


def _dcp_async_options(device: bool) -> tuple[Callable[[], Any] | None, dict[str, Any]]:
    """What this torch's `async_save` takes, found by feature: a factory of DCP's own stager
    (None before torch 2.8, where async_save stages by itself) and the keyword arguments
    (the process executor, where there is one)."""
    import inspect

    import torch.distributed.checkpoint as dcp

    takes = inspect.signature(dcp.async_save).parameters
    kwargs: dict[str, Any] = {}
    if "async_checkpointer_type" in takes:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:
        return None, kwargs
    if "async_stager" not in takes:
        return None, kwargs
    options = StagingOptions(
        use_pinned_memory=device,
        use_shared_memory=True,
        use_async_staging=device,
        use_non_blocking_copy=device,
    )
    return lambda: DefaultStager(options), kwargs


def stager_spent(stager: Any) -> bool:
    """Whether `stager` closed itself while staging and cannot stage again: torch 2.11's
    `DefaultStager._stage` ends with `StateDictStager.close()`, which empties the deepcopy
    dispatch table, so its next stage raises `KeyError: <class 'type'>` (pytorch#183413;
    2.13 stages again). A stager without that table is taken as reusable."""
    inner = getattr(stager, "_state_dict_stager", None)
    table = getattr(inner, "_deepcopy_dispatch", None)
    return isinstance(table, dict) and not table


def _warm_state(state: dict) -> dict:
    """A state of one small tensor where `state`'s live: what a lean run's first
    async_save writes, to start DCP's executor process (seconds) without writing the whole
    state once more (at 8 GB, ~20 s on a lent H200's disk)."""
    import torch

    device = next(iter(state["model"].values())).device
    return {"model": {"warm": torch.ones(1 << 10, device=device)}, "loop": {"step": 0}}


def peer_dcp_async(state: dict, work: Path, repeats: int, paired: bool = True) -> dict:
    """DCP async_save with the process executor and DCP's own stager, set up for where the
    state lives: device state needs a CPU backend in the process group (async_save asserts
    it), and is staged into pinned shared host memory on a background thread; the stall is
    the call plus the wait for that staging (the loop may then change the tensors). One
    stager serves every save, as DCP means it to, except on a torch whose stager closes
    itself after a stage (`stager_spent`): there each save gets a fresh one (and pays for
    its allocation and pinning, as DCP's own users do on that torch). The first save is
    untimed (it starts the executor process): of the whole state with `paired`, of a
    small one in a lean run (`_warm_state`)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    device = on_device(state)
    backend = "cpu:gloo,cuda:nccl" if device else "gloo"
    dist.init_process_group(backend, init_method=f"file://{work / 'store'}", rank=0, world_size=1)
    make_stager, kwargs = _dcp_async_options(device)
    stager = make_stager() if make_stager else None
    stalls, durables, fresh = [], [], 0
    warm = state if paired else _warm_state(state)
    try:
        for r in range(repeats + 1):
            if stager is not None and stager_spent(stager):
                stager.close()
                stager, fresh = make_stager(), fresh + 1
            if stager is not None:
                kwargs["async_stager"] = stager
            t0 = time.perf_counter()
            saved = state if r else warm
            resp = dcp.async_save(saved, checkpoint_id=str(work / f"a{r}"), **kwargs)
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
            progress(f"dcp_async: save {r} durable")
    finally:
        if stager is not None:
            stager.close()
        dist.destroy_process_group()
    stager_use = "none" if make_stager is None else "fresh per save" if fresh else "reused"
    return {"stall_s": med(stalls), "durable_s": med(durables), "stager": stager_use}


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


def _dlrover_memory_saves(ckpt: Any, state: dict, work: Path, repeats: int, paired: bool) -> dict:
    """MEMORY saves (the stall); with `paired`, each after a memcpy floor of its own."""
    from dlrover.trainer.torch.flash_checkpoint.ddp import StorageType

    tensors, dst = list(state["model"].values()), None
    stalls, stall_pairs = [], []
    for r in range(repeats + 1):
        floor = copy_once(tensors, dst) if r and paired else 0.0
        t0 = time.perf_counter()
        ckpt.save_checkpoint(r, state, str(work / f"{r}.pt"), storage_type=StorageType.MEMORY)
        stall = time.perf_counter() - t0
        if r:  # the first save allocates the shared memory and starts the saver
            stalls.append(stall)
            stall_pairs.append((floor, stall))
        elif paired:
            dst = copy_buffer(tensors)
    out: dict[str, Any] = {"stall_s": med(stalls)}
    if paired:
        out["stall_pairs"] = pair_ratios(stall_pairs)
    return out


def _dlrover_disk_saves(ckpt: Any, state: dict, work: Path, repeats: int, paired: bool) -> dict:
    """DISK saves, timed to the tracker naming the step and to the file fsynced; with
    `paired`, each bracketed by two disk floors."""
    from dlrover.trainer.torch.flash_checkpoint.ddp import StorageType

    buffer, writers = (floor_buffer(nbytes(state)), bracket_writers()) if paired else (None, 0)
    tracker = work / "dlrover_latest.txt"
    durables, synced, fsyncs, file_bytes, durable_pairs, synced_pairs = [], [], [], [], [], []
    for r in range(repeats + 1, 2 * repeats + 1):
        floor = settled_floor(work / "floor.bin", buffer, writers) if paired else 0.0
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
        if paired:
            after = settled_floor(work / "floor.bin", buffer, writers)
            durable_pairs.append((floor, durables[-1], after))
            synced_pairs.append((floor, synced[-1], after))
    out = {"durable_s": med(durables), "synced_s": med(synced), "synced_fsync_s": med(fsyncs),
           "file_bytes": max(file_bytes)}  # fmt: skip
    if paired:
        out["durable_pairs"] = bracket_ratios(durable_pairs)
        out["synced_pairs"] = bracket_ratios(synced_pairs)
        out["disk_brackets"] = durable_pairs
    return out


def peer_dlrover(state: dict, work: Path, repeats: int, paired: bool = True) -> dict:
    """DLRover 0.6.1: MEMORY saves (the stall), then DISK saves (durable), then restores
    from its shared memory.

    A DISK save copies the state into shared memory, and DLRover's saver process writes it
    with `torch.save` to the path given (`work/{step}.pt`, the state plus ~4 KB of zip
    framing) and fsyncs only its tracker file (`dlrover_latest.txt`): `durable_s` is the
    save call to the tracker naming the step, with the state still in the page cache.
    `synced_s` adds what makes the state itself durable: an fsync of that file and of its
    directory, timed from the same save call. With `paired`, each DISK save is bracketed
    by two floors; the step two back is deleted between the save and the second floor
    (where argosy's prune falls), outside the timing, so each holds two steps when a
    bracket starts."""
    try:
        ckpt = _dlrover_checkpointer(work)
    except ImportError as err:
        return {"missing": f"dlrover not installed ({err}); pip install -e '.[bench]'"}
    progress("dlrover: checkpointer up")
    out = _dlrover_memory_saves(ckpt, state, work, repeats, paired)
    progress("dlrover: memory saves done")
    out |= _dlrover_disk_saves(ckpt, state, work, repeats, paired)
    progress("dlrover: disk saves done")
    mem_loads = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy_into(state, ckpt.load_checkpoint())
        mem_loads.append(time.perf_counter() - t0)
    return out | {"memory_restore_s": med(mem_loads)}


def bench_job_prefix(pid: int | None = None) -> str:
    """The job-name prefix of this worker's argosy checkpointers (of worker `pid`'s): a
    worker's clean-up removes only its own shared-memory slots, never those of a worker
    running beside it."""
    return f"bench-{pid or os.getpid()}-"


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


def _argosy_stalls(ckpt: Any, state: dict, work: Path, repeats: int, paired: bool) -> dict:
    """Saves with nothing to overlap: the stall (save + fence), each save then waited
    until durable. With `paired`, the memmove and memcpy floors right before each save;
    without, the time to durable of these same saves is the figure (`durable_s`)."""
    tensors = list(state["model"].values())
    dst = copy_buffer(tensors) if paired else None
    stalls, durables, persists, stall_pairs, memmove_pairs = [], [], [], [], []
    phases = []
    for r in range(1, repeats + 1):
        wait_pruned(work, keep=2)  # the last save's cleanup (an unlink) is not this one's
        if paired:
            alone = memmove_once(tensors, dst)  # the persister's copy alone, here
            floor = copy_once(tensors, dst)  # the pair's memcpy floor, this very moment
        t0, m0 = time.perf_counter(), time.monotonic()
        ckpt.save(r, state)
        ckpt.before_optimizer_step()
        stalls.append(time.perf_counter() - t0)
        ckpt.wait()
        durables.append(time.perf_counter() - t0)
        persists.append(durables[-1] - ckpt.last_copy_s)
        phases.append(save_timeline(ckpt, m0))
        if paired:
            stall_pairs.append((floor, stalls[-1]))
            if alone is not None:
                memmove_pairs.append((alone, stalls[-1]))
    if paired:
        return {"stall_s": med(stalls), "stall_pairs": pair_ratios(stall_pairs),
                "memmove_stall_pairs": pair_ratios(memmove_pairs)}  # fmt: skip
    out = {"stall_s": med(stalls), "durable_s": med(durables), "persist_s": med(persists)}
    return out | phase_medians(phases)


def _argosy_overlapped(ckpt: Any, state: dict, first: int, repeats: int, copy_s: float) -> float:
    """Median stall of saves with a step's worth of compute (twice the plain stall)
    between the save and its fence, steps `first`..; each save waited until durable."""
    overlapped = []
    for r in range(first, first + repeats):
        t0 = time.perf_counter()
        ckpt.save(r, state)
        stall = time.perf_counter() - t0
        busy(2 * copy_s)  # the next step's forward/backward
        t1 = time.perf_counter()
        ckpt.before_optimizer_step()
        overlapped.append(stall + time.perf_counter() - t1)
        ckpt.wait()
    return med(overlapped)


def _argosy_bracketed(ckpt: Any, state: dict, work: Path, first: int, repeats: int) -> dict:
    """Durable saves, steps `first`.., each bracketed by a disk floor on either side."""
    buffer, writers = floor_buffer(nbytes(state)), bracket_writers()
    floors, durables, persists, durable_pairs, persist_pairs = [], [], [], [], []
    phases = []
    for r in range(first, first + repeats):
        wait_pruned(work, keep=2)
        before = settled_floor(work / "floor.bin", buffer, writers)  # the bracket's first
        settle_disk()
        t0, m0 = time.perf_counter(), time.monotonic()
        ckpt.save(r, state)
        ckpt.wait()  # a durable save: save, then wait (the fence is wait's own first step)
        durables.append(time.perf_counter() - t0)
        persists.append(durables[-1] - ckpt.last_copy_s)  # from the snapshot in memory on
        phases.append(save_timeline(ckpt, m0))
        wait_pruned(work, keep=2)  # the prune after the flush, as before the first floor
        after = settled_floor(work / "floor.bin", buffer, writers)
        floors += [before, after]
        durable_pairs.append((before, durables[-1], after))
        persist_pairs.append((before, persists[-1], after))
    return {
        "durable_s": med(durables),
        "persist_s": med(persists),
        "disk_floor_s": med(floors),  # around the durable saves
        "durable_pairs": bracket_ratios(durable_pairs),
        "persist_pairs": bracket_ratios(persist_pairs),
        "disk_brackets": durable_pairs,
        "writers": writers,
    } | phase_medians(phases)


def _argosy_restores(
    ckpt: Any, state: dict, work: Path, job: str, repeats: int, disk_repeats: int
) -> dict:
    """Restores into the state's own tensors: `repeats` from shared memory (`ckpt`, then
    closed), then `disk_repeats` from disk with a cold page cache (a fresh reader)."""
    from argosy.checkpoint import FlashCheckpointer

    mem_loads, disk_loads = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ckpt.load(into=state)
        mem_loads.append(time.perf_counter() - t0)
    ckpt.close()
    reader = FlashCheckpointer(work, job_id=job, prestart=False)
    for _ in range(disk_repeats):
        evict(work)
        t0 = time.perf_counter()
        reader.load(into=state)
        disk_loads.append(time.perf_counter() - t0)
    reader.close()
    return {"memory_restore_s": med(mem_loads), "disk_restore_s": med(disk_loads)}


def save_timeline(ckpt: Any, t0: float) -> dict[str, float]:
    """A durable save's phases in seconds from its `save` (`t0`: `time.monotonic()`): its
    copy's end, rank 0's shard write's start and end, the commit. A write that follows
    the copy starts before the copy ends; one that waits for the copy, after it."""
    if ckpt.last_copy_end is None or ckpt.last_write is None:
        return {}
    start, written, committed = (t - t0 for t in ckpt.last_write)
    return {"copy_end_s": ckpt.last_copy_end - t0, "write_start_s": start,
            "write_end_s": written, "commit_s": committed - written}  # fmt: skip


def phase_medians(phases: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over the saves that reported it."""
    keys = sorted({k for p in phases for k in p})
    return {k: med([p[k] for p in phases if k in p]) for k in keys}


def peer_argosy(state: dict, work: Path, repeats: int, paired: bool = True) -> dict:
    """argosy's FlashCheckpointer: stalls, stalls with compute to overlap, durable saves
    (with `paired`, bracketed by disk floors in rounds of their own; without, the stall
    rounds' own saves, timed on to durable), restores from memory and from disk."""
    from argosy.checkpoint import FlashCheckpointer

    job = bench_job()
    slots = 2 if shutil.disk_usage("/dev/shm").free > 2.5 * nbytes(state) else 1
    ckpt = FlashCheckpointer(work, keep=2, job_id=job, slots=slots)
    ckpt.save(0, state)  # first save: storages move to shared memory, slots are allocated
    ckpt.wait()
    progress("argosy: first save durable")
    out = _argosy_stalls(ckpt, state, work, repeats, paired)
    progress("argosy: stalls done")
    out["stall_overlap_s"] = _argosy_overlapped(ckpt, state, repeats + 1, repeats, out["stall_s"])
    progress("argosy: overlapped stalls done")
    if paired:
        out |= _argosy_bracketed(ckpt, state, work, 2 * repeats + 1, repeats)
        progress("argosy: bracketed durable saves done")
    disk_repeats = repeats if paired else min(repeats, 2)  # 8 GB from disk: seconds each
    return out | _argosy_restores(ckpt, state, work, job, repeats, disk_repeats) | {"slots": slots}


PEERS: dict[str, Callable[..., dict]] = {
    "torch_save": peer_torch_save,
    "dcp_save": peer_dcp_save,
    "dcp_async": peer_dcp_async,
    "dlrover": peer_dlrover,
    "argosy": peer_argosy,
}
"""Every peer by name, in the order the driver runs them."""
