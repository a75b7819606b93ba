"""Checkpoint benchmark: argosy's flash checkpoint against its peers, side by side, one run.

    .venv/bin/python benchmarks/checkpoint.py                 # 1 and 4 GB states + loop figure
    .venv/bin/python benchmarks/checkpoint.py --sizes-gb 0.25 --repeats 3   # quick
    git archive 44a6b9e argosy | tar -x -C /tmp/before    # the code before issue 17
    .venv/bin/python benchmarks/checkpoint.py --first-save .,/tmp/before --repeats 3

Peers (each in its own process, one at a time, so memory is freed between them):
torch.save (+fsync), DCP save, DCP async_save (process executor + cached shared-memory
stager), DLRover flash checkpoint (MEMORY save to shm, DISK for durability; needs the
`bench` extra), argosy FlashCheckpointer. Columns: training-loop stall per save (with
nothing to overlap; argosy also with a step's worth of compute to overlap), time to durable,
restore from memory and from disk (into the existing state tensors, page cache hot), and
the raw memcpy floor (copy of the same bytes into a pre-touched buffer). Then a loop-level
figure: step time of a small training loop with a save every step vs without.
`--first-save TREES`: only the stall of the first saves in a fresh process (64 MiB state),
for each source tree given (this repository and, say, an older commit side by side).
`--startup TREES`: only persister start-up (checkpointer made to first step durable), per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from checkpoint_floors import (
    copy_buffer,
    copy_once,
    disk_floor,
    floor_buffer,
    memcpy_floor,
    pair_ratios,
    write_once,
)

PEERS = ["torch_save", "dcp_save", "dcp_async", "dlrover", "argosy"]
TENSOR_MB = 64


def make_state(gb: float, device: str = "cpu") -> dict[str, Any]:
    import torch

    n = max(1, round(gb * 1024 / TENSOR_MB))
    numel = TENSOR_MB * (1 << 20) // 4
    layers = {
        f"layer{i}.weight": torch.empty(numel, device=device).fill_(i + 0.5) for i in range(n)
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


# -- peers (each runs in a worker process) ----------------------------------------------


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


def peer_dlrover(state: dict, work: Path, repeats: int) -> dict:
    os.environ["TORCHELASTIC_RUN_ID"] = f"argosy-bench-{uuid.uuid4().hex[:8]}"
    try:
        from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType
    except ImportError as err:
        return {"missing": f"dlrover not installed ({err}); pip install -e '.[bench]'"}
    ckpt = DdpCheckpointer(str(work))
    stalls, durables, mem_loads = [], [], []
    tensors, dst = list(state["model"].values()), None
    stall_pairs, durable_pairs = [], []
    synced, synced_pairs = [], []
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
    buffer, writers = floor_buffer(nbytes(state)), int(os.environ["BENCH_FLOOR_WRITERS"])
    for r in range(repeats + 1, 2 * repeats + 1):
        floor = write_once(work / "floor.bin", buffer, writers)  # the pair's disk floor
        t0 = time.perf_counter()
        ckpt.save_checkpoint(r, state, str(work / f"{r}.pt"), storage_type=StorageType.DISK)
        tracker = work / "dlrover_latest.txt"
        while not (tracker.exists() and tracker.read_text().strip() == str(r)):
            time.sleep(0.002)
        durables.append(time.perf_counter() - t0)
        durable_pairs.append((floor, durables[-1]))
        # DLRover's saver writes through torch.save and fsyncs only its tracker: its state
        # sits in the page cache. What it costs to make that file survive the machine:
        written = work / f"{r}.pt"
        fsync_tree(written if written.exists() else work)
        synced.append(time.perf_counter() - t0)
        synced_pairs.append((floor, synced[-1]))
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
        "durable_pairs": pair_ratios(durable_pairs),
        "synced_s": med(synced),
        "synced_pairs": pair_ratios(synced_pairs),
    }


def peer_argosy(state: dict, work: Path, repeats: int) -> dict:
    from argosy.checkpoint import FlashCheckpointer

    job = f"bench-{uuid.uuid4().hex[:8]}"
    free = shutil.disk_usage("/dev/shm").free
    slots = 2 if free > 2.5 * nbytes(state) else 1
    ckpt = FlashCheckpointer(work, keep=2, job_id=job, slots=slots)
    ckpt.save(0, state)  # first save: storages move to shared memory, slots are allocated
    ckpt.wait()
    stalls, overlapped, durables, persists, mem_loads = [], [], [], [], []
    tensors = list(state["model"].values())
    dst = copy_buffer(tensors)
    stall_pairs, durable_pairs, persist_pairs = [], [], []
    for r in range(1, repeats + 1):
        floor = copy_once(tensors, dst)  # the pair's memcpy floor, this very moment
        t0 = time.perf_counter()
        ckpt.save(r, state)
        ckpt.before_optimizer_step()
        stalls.append(time.perf_counter() - t0)
        stall_pairs.append((floor, stalls[-1]))
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
    buffer, writers = floor_buffer(nbytes(state)), int(os.environ["BENCH_FLOOR_WRITERS"])
    floors = []
    for r in range(2 * repeats + 1, 3 * repeats + 1):
        floors.append(write_once(work / "floor.bin", buffer, writers))  # the pair's floor
        t0 = time.perf_counter()
        ckpt.save(r, state)
        ckpt.before_optimizer_step()  # the snapshot is in memory: the persist starts
        t1 = time.perf_counter()
        ckpt.wait()
        durables.append(time.perf_counter() - t0)
        persists.append(time.perf_counter() - t1)
        durable_pairs.append((floors[-1], durables[-1]))
        persist_pairs.append((floors[-1], persists[-1]))
    for _ in range(repeats):
        t0 = time.perf_counter()
        ckpt.load(into=state)
        mem_loads.append(time.perf_counter() - t0)
    ckpt.close()
    reader = FlashCheckpointer(work, job_id=job, prestart=False)
    disk_loads = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        reader.load(into=state)
        disk_loads.append(time.perf_counter() - t0)
    reader.close()
    return {
        "stall_s": med(stalls),
        "stall_overlap_s": med(overlapped),
        "durable_s": med(durables),
        "persist_s": med(persists),
        "disk_floor_s": med(floors),  # interleaved with the durable saves
        "memory_restore_s": med(mem_loads),
        "disk_restore_s": med(disk_loads),
        "slots": slots,
        "stall_pairs": pair_ratios(stall_pairs),
        "durable_pairs": pair_ratios(durable_pairs),
        "persist_pairs": pair_ratios(persist_pairs),
    }


# -- the loop-level figure --------------------------------------------------------------


def loop_figure(steps: int, interval_s: float) -> dict:
    import torch

    from argosy.checkpoint import FlashCheckpointer

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 2048)
    work = Path(tempfile.mkdtemp(prefix="argosy-bench-loop-"))
    job = f"bench-{uuid.uuid4().hex[:8]}"
    ckpt = FlashCheckpointer(work, keep=1, job_id=job, persist_interval_s=interval_s)

    def step(i: int, save: bool) -> float:
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        ckpt.before_optimizer_step()
        opt.step()
        opt.zero_grad()
        if save:
            ckpt.save(i, {"model": model.state_dict(), "optim": opt.state_dict()})
        return time.perf_counter() - t0

    for i in range(3):
        step(i, True)  # warm-up, first save
    ckpt.wait()
    plain, saving = [], []
    for _ in range(4):  # interleave blocks so drift hits both sides alike
        plain += [step(i, False) for i in range(steps // 4)]
        saving += [step(i, True) for i in range(steps // 4)]
        ckpt.wait()  # the disk write of the block's last step must not land in `plain`
    ckpt.wait()
    copy_s = ckpt.last_copy_s
    state_bytes = sum(v.numel() * 4 for v in model.state_dict().values()) * 3
    ckpt.close()
    shutil.rmtree(work, ignore_errors=True)
    return {
        "state_mb": state_bytes / 2**20,
        "step_s": med(plain),
        "step_save_s": med(saving),
        "copy_s": copy_s,
        "interval_s": interval_s,
    }


# -- driver ---------------------------------------------------------------------------


def worker(peer: str, gb: float, repeats: int, device: str = "cpu") -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"argosy-bench-{peer}-"))
    shm_before = set(os.listdir("/dev/shm"))
    try:
        if peer == "loop":
            return {"loops": [loop_figure(repeats, 30.0), loop_figure(repeats, 0.0)]}
        state = make_state(gb, device)
        # the floors: same process, same moment as the peer
        floors = disk_floor(nbytes(state), work, min(repeats, 2))
        os.environ["BENCH_FLOOR_WRITERS"] = str(floors["disk_floor_writers"])
        floors["floor_s"] = memcpy_floor(list(state["model"].values()), repeats)
        result = globals()[f"peer_{peer}"](state, work, repeats)
        result["gb"] = nbytes(state) / 2**30
        return floors | result
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _clean_children_and_shm(shm_before)


def _clean_children_and_shm(before: set[str]) -> None:
    """DLRover leaves its saver process and shm segments behind; remove what this run made."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            child.kill()
    except ImportError:
        pass
    for name in set(os.listdir("/dev/shm")) - before:
        if "ckpt" in name or "argosy-bench" in name or name.startswith("torch_"):
            Path("/dev/shm", name).unlink(missing_ok=True)


def run_peer(peer: str, gb: float, repeats: int, device: str = "cpu") -> dict:
    cmd = [sys.executable, "-W", "ignore", __file__, "--worker", peer, "--gb", str(gb)]
    cmd += ["--repeats", str(repeats), "--device", device]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"missing": f"failed (rc {proc.returncode}): {' | '.join(tail)}"}
    return json.loads(lines[-1][len("RESULT ") :])


def fmt(x: Any) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


COLUMNS = {
    "stall/save s": "stall_s",
    "stall overlapped s": "stall_overlap_s",
    "durable s": "durable_s",
    "persist s": "persist_s",
    "restore mem s": "memory_restore_s",
    "restore disk s": "disk_restore_s",
    "memcpy floor s": "floor_s",
    "disk floor s": "disk_floor_s",
    "durable / disk floor": "durable_over_floor",
}
"""Table columns: "persist" is argosy's time from the snapshot in memory to durable."""


def _row(r: dict) -> list[str]:
    if r.get("durable_s") and r.get("disk_floor_s"):
        r = r | {"durable_over_floor": r["durable_s"] / r["disk_floor_s"]}
    return [fmt(r.get(key)) for key in COLUMNS.values()]


def _note(r: dict) -> str:
    notes = [f"slots={r['slots']}"] if "slots" in r else []
    if "disk_floor_writers" in r:
        notes.append(f"floor: {r['disk_floor_writers']} writer(s)")
    return ", ".join(notes)


def report(results: dict[float, dict[str, dict]], loop: dict | None) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=180)
    md = ["| state | peer | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for gb, peers in results.items():
        table = Table(title=f"{gb:g} GB state (medians)")
        for col in ("peer", *COLUMNS, "note"):
            table.add_column(col, justify="left" if col in ("peer", "note") else "right")
        for peer, r in peers.items():
            if "missing" in r:
                table.add_row(peer, *["-"] * len(COLUMNS), r["missing"][:60])
                md.append(f"| {gb:g} GB | {peer} | n/a: {r['missing'][:60]} |")
                continue
            cells = _row(r)
            table.add_row(peer, *cells, _note(r))
            md.append(f"| {gb:g} GB | {peer} | " + " | ".join(cells) + " |")
        console.print(table)
        for line in ratios(peers):
            console.print("  " + line)
            md.append(f"\n{gb:g} GB: {line}")
        md.append("")
    for lp in (loop or {}).get("loops", []):
        overhead = lp["step_save_s"] / lp["step_s"] - 1
        disk = f"disk every {lp['interval_s']:g} s" if lp["interval_s"] else "disk continuously"
        line = (
            f"loop ({disk}): {lp['state_mb']:.0f} MB state, step {lp['step_s'] * 1e3:.1f} ms"
            f" without saving, {lp['step_save_s'] * 1e3:.1f} ms with a save every step"
            f" (overhead {overhead * 100:+.1f}%, target <= 5%; copy/step"
            f" {(lp['copy_s'] or float('nan')) / lp['step_s']:.2f})"
        )
        console.print(line)
        md.append(line)
    return "\n".join(md)


RATIOS = [  # (what, argosy's figure, peer, the peer's figure)
    ("argosy overlapped stall / DLRover stall (target <= 0.5)",
     "stall_overlap_s", "dlrover", "stall_s"),
    ("argosy stall, nothing to overlap / memcpy floor (target <= 1.2)",
     "stall_s", "argosy", "floor_s"),
    ("argosy restore from memory / DLRover (target <= 1.2)",
     "memory_restore_s", "dlrover", "memory_restore_s"),
    ("argosy restore from disk / DCP load (target <= 1.2)",
     "disk_restore_s", "dcp_save", "disk_restore_s"),
    ("argosy time to durable / DCP save (target <= 1.3)", "durable_s", "dcp_save", "durable_s"),
    ("argosy time to durable / disk floor (target <= 1.1)",
     "durable_s", "argosy", "disk_floor_s"),
    ("argosy persist (snapshot in memory to durable) / disk floor",
     "persist_s", "argosy", "disk_floor_s"),
    ("argosy time to durable / DLRover's (target <= 1.0)", "durable_s", "dlrover", "durable_s"),
    ("argosy time to durable / DLRover's with its file fsynced",
     "durable_s", "dlrover", "synced_s"),
]  # fmt: skip


PAIRED = [  # (what, peer, its pairs): per-pair ratios, each figure over the floor just before it
    ("argosy stall, nothing to overlap / memcpy floor, per pair (target <= 1.0)",
     "argosy", "stall_pairs"),
    ("argosy time to durable / disk floor, per pair (target <= 1.1)", "argosy", "durable_pairs"),
    ("argosy persist (snapshot in memory to durable) / disk floor, per pair",
     "argosy", "persist_pairs"),
    ("DLRover stall (memory save) / memcpy floor, per pair", "dlrover", "stall_pairs"),
    ("DLRover time to durable / disk floor, per pair", "dlrover", "durable_pairs"),
    ("DLRover with its file fsynced / disk floor, per pair", "dlrover", "synced_pairs"),
]  # fmt: skip


def ratios(peers: dict[str, dict]) -> list[str]:
    a, out = peers.get("argosy", {}), []
    for label, key, peer, peer_key in RATIOS:
        mine, theirs = a.get(key), peers.get(peer, {}).get(peer_key)
        if isinstance(mine, float) and isinstance(theirs, float) and theirs > 0:
            out.append(f"{label}: {mine / theirs:.2f}")
        else:
            out.append(f"{label}: n/a ({peer} missing)")
    for label, peer, key in PAIRED:
        p = peers.get(peer, {}).get(key)
        if p:
            out.append(
                f"{label}: median {p['median']:.2f} over {p['pairs']} pairs"
                f" (lowest {p['low']:.2f}, highest {p['high']:.2f})"
            )
    return out


FIRST_SAVE = r"""
import sys, tempfile, time, uuid
import torch
from argosy.checkpoint import FlashCheckpointer
state = {"w": torch.randn(16 << 20), "b": torch.randn(1000)}  # 64 MiB
with tempfile.TemporaryDirectory() as d:
    ckpt = FlashCheckpointer(d, job_id=f"fs-{uuid.uuid4().hex[:8]}")
    time.sleep(0.5)  # the load and the first steps of a restarted trainer
    stalls = []
    for step in range(1, 6):
        t0 = time.perf_counter()
        ckpt.before_optimizer_step()
        state["w"].add_(1)
        ckpt.save(step, state)
        ckpt.before_optimizer_step()
        stalls.append(time.perf_counter() - t0)
        time.sleep(0.2)
    ckpt.wait()
    ckpt.close()
print("STALLS", " ".join(f"{s:.3f}" for s in stalls))
"""


STARTUP = r"""
import tempfile, time, uuid
t0 = time.perf_counter()
import torch
from argosy.checkpoint import FlashCheckpointer
with tempfile.TemporaryDirectory() as d:  # a 64 KiB state, held until the persister is up
    t1 = time.perf_counter()
    ckpt = FlashCheckpointer(d, job_id=f"su-{uuid.uuid4().hex[:8]}")
    ckpt.save(1, {"w": torch.ones(1 << 14)})
    ckpt.wait()
    t2 = time.perf_counter()
    ckpt.close()
print(f"STARTUP {t1 - t0:.3f} {t2 - t1:.3f}")
"""


def _snippet_figures(code: str, tree: str, tag: str) -> list[float]:
    """Run `code` in a fresh Python with `tree` first on its path (from elsewhere: the cwd
    must not shadow it); the numbers on the output line that starts with `tag`."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True, timeout=600,
        check=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    line = next(x for x in done.stdout.splitlines() if x.startswith(tag))
    return [float(x) for x in line.split()[1:]]


def startup(runs: int, tree: str) -> None:
    """Persister start-up, as a restarted trainer sees it: seconds from making the
    checkpointer to its first step durable (64 KiB state), next to the trainer's own
    import of torch, in fresh processes."""
    tree, imports, durable = str(Path(tree).resolve()), [], []
    for _ in range(runs):
        a, b = _snippet_figures(STARTUP, tree, "STARTUP")
        imports.append(a)
        durable.append(b)
    print(
        f"{tree}: checkpointer made -> first step durable {statistics.median(durable):.2f} s"
        f" median {durable}; the trainer's torch import {statistics.median(imports):.2f} s"
    )


def first_save(runs: int, tree: str) -> None:
    """Stall of the first saves in a fresh process (save + fence), `runs` processes, for the
    code under `tree` (default: this repository; a `git archive` of an older commit
    compares with it)."""
    tree = str(Path(tree).resolve())
    firsts, laters = [], []
    for _ in range(runs):
        stalls = _snippet_figures(FIRST_SAVE, tree, "STALLS")
        firsts.append(stalls[0])
        laters += stalls[2:]
    print(
        f"{tree}: first save {statistics.median(firsts):.3f} s median {firsts}, "
        f"later saves {statistics.median(laters):.3f} s median"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-gb", default="1,4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--loop-steps", type=int, default=40)
    parser.add_argument(
        "--device", default="cpu", help="where the state lives: cpu, or cuda on a GPU host"
    )
    parser.add_argument("--markdown", type=Path, default=None, help="Also write a table here.")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gb", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--first-save", default=None, metavar="TREES",
        help="only: first-save stall in fresh processes, per source tree (comma-separated)",
    )  # fmt: skip
    parser.add_argument(
        "--startup", default=None, metavar="TREES",
        help="only: persister start-up to the first durable step, per source tree",
    )  # fmt: skip
    args = parser.parse_args()
    if args.startup:
        for tree in args.startup.split(","):
            startup(args.repeats, tree)
        return
    if args.first_save:
        for tree in args.first_save.split(","):
            first_save(args.repeats, tree)
        return
    if args.worker:
        result = worker(args.worker, args.gb, args.repeats, args.device)
        print("RESULT " + json.dumps(result), flush=True)
        return
    results: dict[float, dict[str, dict]] = {}
    for gb in [float(s) for s in args.sizes_gb.split(",")]:
        repeats = args.repeats if gb <= 1 else max(3, args.repeats // 2)
        results[gb] = {}
        for peer in args.peers.split(","):
            print(f"[{gb:g} GB] {peer} ...", file=sys.stderr, flush=True)
            results[gb][peer] = run_peer(peer, gb, repeats, args.device)
    loop = None
    if args.loop_steps:
        print("[loop] ...", file=sys.stderr, flush=True)
        loop = run_peer("loop", 0, args.loop_steps)
        loop = None if "missing" in loop else loop
    md = report(results, loop)
    if args.markdown:
        args.markdown.write_text(md + "\n")


if __name__ == "__main__":
    main()
