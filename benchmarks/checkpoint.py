"""Checkpoint benchmark: argosy's flash checkpoint against its peers, side by side, one run.

    .venv/bin/python benchmarks/checkpoint.py                 # 1 and 4 GB states + loop figure
    .venv/bin/python benchmarks/checkpoint.py --sizes-gb 0.25 --repeats 3   # quick
    git archive 44a6b9e argosy | tar -x -C /tmp/before    # the code before issue 17
    .venv/bin/python benchmarks/checkpoint.py --first-save .,/tmp/before --repeats 3
    PYTHONPATH=/tmp/dl .venv/bin/python benchmarks/checkpoint.py --sizes-gb 1 --peers duel

Peers (checkpoint_peers.py; each in its own process, one at a time, so memory is freed
between them): torch.save (+fsync), DCP save, DCP async_save (process executor + cached
shared-memory stager), DLRover flash checkpoint (MEMORY save to shm, DISK for durability;
needs the `bench` extra), argosy FlashCheckpointer; `duel`: argosy and DLRover (its file
fsynced) in turns in one process (checkpoint_duel.py). Floors: checkpoint_floors.py. This
file is the driver: worker processes, the loop figure, the table and the ratios.
Columns: training-loop stall per save (with nothing to overlap; argosy also with a step's
worth of compute to overlap), time to durable, restore from memory and from disk (into the
existing state tensors, page cache hot), and the raw memcpy floor (copy of the same bytes
into a pre-touched buffer). Then a loop-level
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
from pathlib import Path
from typing import Any

from checkpoint_duel import duel
from checkpoint_floors import disk_floor, memcpy_floor
from checkpoint_peers import (
    PEERS,
    TENSOR_MB,
    bench_job,
    bench_job_prefix,
    make_state,
    med,
    nbytes,
)

from argosy.checkpoint.launch import persister_env

RUNNERS = PEERS | {"duel": duel}
"""What a worker runs: every peer, and `duel` (argosy and DLRover in turns, one process)."""

# -- the loop-level figure --------------------------------------------------------------


def loop_figure(steps: int, interval_s: float) -> dict:
    import torch

    from argosy.checkpoint import FlashCheckpointer

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 2048)
    work = Path(tempfile.mkdtemp(prefix="argosy-bench-loop-"))
    job = bench_job()
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


def worker(
    peer: str, gb: float, repeats: int, device: str = "cpu", tensor_mb: float = TENSOR_MB
) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"argosy-bench-{peer}-"))
    shm_before = set(os.listdir("/dev/shm"))
    try:
        if peer == "loop":
            return {"loops": [loop_figure(repeats, 30.0), loop_figure(repeats, 0.0)]}
        state = make_state(gb, device, tensor_mb)
        # the floors: same process, same moment as the peer
        floors = disk_floor(nbytes(state), work, min(repeats, 2))
        floors["floor_s"] = memcpy_floor(list(state["model"].values()), repeats)
        result = RUNNERS[peer](state, work, repeats)
        result["gb"] = nbytes(state) / 2**30
        result["bytes"] = nbytes(state)
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
    mine = f"argosy-ckpt-{bench_job_prefix()}"  # argosy slots of other workers stay
    for name in set(os.listdir("/dev/shm")) - before:
        theirs = name.startswith("argosy-ckpt-") and not name.startswith(mine)
        if not theirs and ("ckpt" in name or name.startswith("torch_")):
            Path("/dev/shm", name).unlink(missing_ok=True)


def run_peer(
    peer: str, gb: float, repeats: int, device: str = "cpu", tensor_mb: float = TENSOR_MB
) -> dict:
    cmd = [sys.executable, "-W", "ignore", __file__, "--worker", peer, "--gb", str(gb)]
    cmd += ["--repeats", str(repeats), "--device", device, "--tensor-mb", str(tensor_mb)]
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
    if "disk_floor_by_writers" in r:
        by = ", ".join(f"{w}: {t:.2f} s" for w, t in r["disk_floor_by_writers"].items())
        notes.append(f"start-up floor by writers {by}")
    if "writers" in r:
        notes.append(f"bracket floors: {r['writers']} writer(s), as argosy's")
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
    ("argosy stall, nothing to overlap / memmove floor (its copy alone, in-process), per pair",
     "argosy", "memmove_stall_pairs"),
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
            out.append(f"{label}: {_pairs(p)}")
    return out + _dlrover_synced(a, peers.get("dlrover", {})) + _duel(peers.get("duel", {}))


def _pairs(p: dict) -> str:
    """Per-pair ratios: median over n (lowest, highest); for a bracket (floor, save, floor),
    over the two floors' mean, then over the faster floor, and the floors' drift."""
    line = f"median {p['median']:.2f} over {p['pairs']} pairs ({p['low']:.2f}-{p['high']:.2f})"
    if "over_faster" in p:
        f, d = p["over_faster"], p["drift"]
        line = (
            f"{line} over the mean of the floors before and after; over the faster of the two"
            f" {f['median']:.2f} ({f['low']:.2f}-{f['high']:.2f}), over the one before"
            f" {p['over_before']['median']:.2f}, after {p['over_after']['median']:.2f};"
            f" floor after / before {d['median']:.2f} ({d['low']:.2f}-{d['high']:.2f})"
        )
    return line


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)})"


def _duel(d: dict) -> list[str]:
    """The duel's lines: both over their floors, and head to head, round by round."""
    if "head_to_head" not in d:
        return []
    return [
        f"duel, argosy time to durable / disk floor: {_pairs(d['durable_pairs'])}",
        f"duel, DLRover with its file fsynced / disk floor: {_pairs(d['synced_pairs'])}",
        "duel, argosy time to durable / DLRover's with its file fsynced, same round"
        f" (target <= 1.0): {_spread(d['head_to_head'])}",
        "duel, the same, each over the mean of its two floors:"
        f" {_spread(d['head_to_head_over_floors'])}",
    ]


def _dlrover_synced(a: dict, d: dict) -> list[str]:
    """argosy's durable against DLRover's with its file fsynced, each over the floor of its
    own pairs (the two run in different processes, minutes apart: their floors differ)."""
    if "synced_pairs" not in d:
        return []
    out = [
        f"DLRover wrote {d['file_bytes']:,} bytes per step (the state: {a.get('bytes', 0):,});"
        f" its fsync alone took {d['synced_fsync_s']:.3f} s (median)"
    ]
    if a.get("durable_pairs") and d["synced_pairs"]:
        ratio = a["durable_pairs"]["median"] / d["synced_pairs"]["median"]
        out.append(
            "argosy time to durable / DLRover's with its file fsynced, each over its own"
            f" pairs' floors (target <= 1.0): {ratio:.2f}"
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
    parser.add_argument(
        "--tensor-mb", type=float, default=TENSOR_MB,
        help=f"size of each state tensor (default {TENSOR_MB}; 1 gives 1,024 tensors a GB)",
    )  # fmt: skip
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
        env = persister_env(os.environ)  # glibc reads its tunables once, at the start
        if env != dict(os.environ):  # every peer and the memmove floor, as the persister
            os.execve(sys.executable, [sys.executable, "-W", "ignore", *sys.argv], env)
        result = worker(args.worker, args.gb, args.repeats, args.device, args.tensor_mb)
        print("RESULT " + json.dumps(result), flush=True)
        return
    results: dict[float, dict[str, dict]] = {}
    for gb in [float(s) for s in args.sizes_gb.split(",")]:
        repeats = args.repeats if gb <= 1 else max(3, args.repeats // 2)
        results[gb] = {}
        for peer in args.peers.split(","):
            print(f"[{gb:g} GB] {peer} ...", file=sys.stderr, flush=True)
            results[gb][peer] = run_peer(peer, gb, repeats, args.device, args.tensor_mb)
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
