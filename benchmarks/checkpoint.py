"""Checkpoint benchmark: argosy's flash checkpoint against its peers, side by side, one run.

    .venv/bin/python benchmarks/checkpoint.py                 # 1 and 4 GB states + loop figure
    .venv/bin/python benchmarks/checkpoint.py --sizes-gb 0.25 --repeats 3   # quick
    git archive 44a6b9e argosy | tar -x -C /tmp/before    # the code before issue 17
    .venv/bin/python benchmarks/checkpoint.py --first-save .,/tmp/before --repeats 3
    PYTHONPATH=/tmp/dl .venv/bin/python benchmarks/checkpoint.py --sizes-gb 1 --peers duel
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/checkpoint.py --device cuda --sizes-gb 8 \
        --repeats 3 --loop-steps 0 --peers argosy,dlrover,dcp_async --json /tmp/ckpt8.json

Peers (checkpoint_peers.py; each in its own process, one at a time, so memory is freed
between them): torch.save (+fsync), DCP save, DCP async_save (process executor + cached
shared-memory stager), DLRover flash checkpoint (MEMORY save to shm, DISK for durability;
needs the `bench` extra), argosy FlashCheckpointer; `duel`: argosy and DLRover (its file
fsynced) in turns in one process (checkpoint_duel.py). Floors: checkpoint_floors.py. This
file is the driver: worker processes, the loop figure and the runs (the tables, ratios
and JSON: checkpoint_report.py).
Columns: training-loop stall per save (with nothing to overlap; argosy also with a step's
worth of compute to overlap), time to durable, restore from memory and from disk (into the
existing state tensors, page cache hot), and the raw memcpy floor (copy of the same bytes
into a pre-touched buffer). Then a loop-level
figure: step time of a small training loop with a save every step vs without.
`--first-save TREES`: only the stall of the first saves in a fresh process (64 MiB state),
for each source tree given (this repository and, say, an older commit side by side).
`--startup TREES`: only persister start-up (checkpointer made to first step durable), per tree.

Modes (`--mode`, auto: full on cpu, lean on a device): `full` pairs every save of argosy and
DLRover with floors measured around it (tens of writes of the whole state: the better part
of an hour at 8 GB); `lean` measures the floors once per size, in a worker of their own
(copy floor: memcpy, or device-to-pinned-host for device state; disk floor: argosy's writer
count, buffered and direct), then times the peers' own saves alone. Each peer's line is
printed as it ends; `--json` is rewritten after each; a worker past `--peer-timeout-s` is
killed with its children and reported as timed out (with the last phase it reached), and
the rest still run. Workers run under this interpreter (`sys.executable`) with the
repository on PYTHONPATH, so no venv is needed where torch is installed.
"""

from __future__ import annotations

import argparse
import contextlib
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
from checkpoint_floors import bracket_writers, copy_floor_kind, disk_floor, memcpy_floor
from checkpoint_peers import (
    PEERS,
    TENSOR_MB,
    bench_job,
    bench_job_prefix,
    make_state,
    med,
    nbytes,
    progress,
)
from checkpoint_report import FLOORS, merged, report, summary, write_json

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

REPO = Path(__file__).resolve().parents[1]


def measure_floors(state: dict, work: Path, repeats: int, how: str) -> dict[str, Any]:
    """The floors beside a peer: `full`, the disk floor over 1, 2 and 4 writers each way,
    twice; `lean`, once, with argosy's writer count only, direct I/O only where it works
    (one write of the whole state: at 8 GB, seconds); `none`. Both add the copy floor: memcpy into a
    pre-touched host buffer, or device-to-host into pinned memory for device state."""
    if how == "none":
        return {}
    tensors = list(state["model"].values())
    if how == "lean":
        floors = disk_floor(nbytes(state), work, 1, (bracket_writers(),), direct_only=True)
    else:
        floors = disk_floor(nbytes(state), work, min(repeats, 2))
    floors["floor_s"] = memcpy_floor(tensors, repeats)
    floors["copy_floor"] = copy_floor_kind(tensors)
    return floors


def versions(device: str) -> dict[str, str]:
    """torch's version, and the device's name for device state."""
    import torch

    out = {"torch": torch.__version__}
    if device.startswith("cuda"):
        out["device_name"] = torch.cuda.get_device_name()
    return out


def worker(
    peer: str,
    gb: float,
    repeats: int,
    device: str = "cpu",
    tensor_mb: float = TENSOR_MB,
    floors: str = "full",
    paired: bool = True,
) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"argosy-bench-{peer}-"))
    shm_before = shm_files()
    try:
        if peer == "loop":
            return {"loops": [loop_figure(repeats, 30.0), loop_figure(repeats, 0.0)]}
        t0 = time.perf_counter()
        state = make_state(gb, device, tensor_mb)
        made_s = time.perf_counter() - t0
        progress(f"state made: {nbytes(state) / 2**30:g} GB on {device}")
        # the floors: same process, same moment as the peer
        result = measure_floors(state, work, repeats, "lean" if peer == FLOORS else floors)
        progress("floors measured")
        if peer != FLOORS:
            result |= RUNNERS[peer](state, work, repeats, paired)
        result["gb"] = nbytes(state) / 2**30
        result["bytes"] = nbytes(state)
        result["state_made_s"] = made_s
        return result | versions(device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _clean_children_and_shm(shm_before)


def _kill_tree(pid: int | None = None) -> None:
    """Kill every descendant of `pid` (of this process when None); none without psutil."""
    try:
        import psutil

        children = psutil.Process(pid).children(recursive=True)
    except Exception:  # psutil missing, or `pid` gone already
        return
    for child in children:
        with contextlib.suppress(Exception):  # it ended meanwhile
            child.kill()


def shm_files() -> set[Path]:
    """The shared-memory files now: /dev/shm's (DLRover's, torch's) and those of argosy's
    slot folder (this user's, inside it)."""
    from argosy.checkpoint.segment import SHM_DIR

    folders = [Path("/dev/shm"), SHM_DIR]
    return {path for folder in folders if folder.is_dir() for path in folder.iterdir()}


def _clean_children_and_shm(before: set[Path], pid: int | None = None) -> None:
    """DLRover leaves its saver process and shm segments behind; remove what this run made.
    `pid`: a worker's that was killed (the driver's clean-up after a timeout); None: this
    process, a worker, whose every child is the run's."""
    _kill_tree(pid)
    clean_shm(before, pid)


def clean_shm(before: set[Path], pid: int | None = None) -> None:
    """Unlink the checkpoint segments that appeared since `before` and belong to the worker
    `pid` (this process when None): argosy slots of other workers stay."""
    mine = f"argosy-ckpt-{bench_job_prefix(pid)}"
    for path in shm_files() - before:
        name = path.name
        theirs = name.startswith("argosy-ckpt-") and not name.startswith(mine)
        if path.is_file() and not theirs and ("ckpt" in name or name.startswith("torch_")):
            path.unlink(missing_ok=True)


def child_env() -> dict[str, str]:
    """The environment of a worker: this one, with the repository on PYTHONPATH (the
    worker, and argosy's persister it starts, import argosy from there when no venv has
    it installed: `PYTHONPATH=/tmp/site:<repo> python3 benchmarks/checkpoint.py`)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths:
        paths.append(str(REPO))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def _kill_worker(proc: subprocess.Popen) -> None:
    """A worker past its time: its children first (DLRover's saver, DCP's executor,
    argosy's persister, which runs in a session of its own), then the worker."""
    _kill_tree(proc.pid)
    proc.kill()
    proc.wait()


def run_peer(
    peer: str,
    gb: float,
    repeats: int,
    device: str = "cpu",
    tensor_mb: float = TENSOR_MB,
    *,
    floors: str = "full",
    paired: bool = True,
    timeout_s: float = 1800.0,
) -> dict:
    """Run one peer in a worker process of its own; {"missing": why} when it failed or
    ran past `timeout_s` (killed then, with its children, and its shared memory freed)."""
    cmd = [sys.executable, "-W", "ignore", __file__, "--worker", peer, "--gb", str(gb)]
    cmd += ["--repeats", str(repeats), "--device", device, "--tensor-mb", str(tensor_mb)]
    cmd += ["--worker-floors", floors, "--mode", "full" if paired else "lean"]
    shm_before = shm_files()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # files, not pipes: a child the worker leaves behind must not hold its output open
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=child_env())
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_worker(proc)
            _clean_children_and_shm(shm_before, proc.pid)
            err.seek(0)
            last = [ln for ln in err.read().splitlines() if ln.startswith("progress: ")][-1:]
            return {"missing": f"timed out after {timeout_s:g} s (last: {' '.join(last) or '-'})"}
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        return {"missing": f"failed (rc {proc.returncode}): {' | '.join(tail)}"}
    phases = [ln[len("progress: ") :] for ln in stderr.splitlines() if ln.startswith("progress: ")]
    return json.loads(lines[-1][len("RESULT ") :]) | {"phases": phases}


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


def resolve_mode(mode: str, device: str) -> str:
    """`auto`: `full` (every save paired with its floors) for host state, `lean` for
    device state (the floors once per size, no floor writes between saves: an 8 GB state
    of three peers in minutes, not the better part of an hour)."""
    if mode != "auto":
        return mode
    return "full" if device == "cpu" else "lean"


def run_meta(args: argparse.Namespace, mode: str, timeout_s: float) -> dict:
    import platform

    return {
        "argv": sys.argv[1:],
        "device": args.device,
        "mode": mode,
        "peer_timeout_s": timeout_s,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run_sizes(args: argparse.Namespace) -> dict[float, dict[str, dict]]:
    """Every size, every peer, one worker at a time; each peer's line printed (and the
    JSON rewritten) the moment it ends. A lean run measures the floors once per size,
    in a worker of their own, before the peers."""
    mode = resolve_mode(args.mode, args.device)
    lean = mode == "lean"
    timeout_s = args.peer_timeout_s or (120.0 if lean else 1800.0)
    meta = run_meta(args, mode, timeout_s)
    results: dict[float, dict[str, dict]] = {}
    floors: dict[float, dict] = {}
    for gb in [float(s) for s in args.sizes_gb.split(",")]:
        repeats = args.repeats if gb <= 1 or lean else max(3, args.repeats // 2)
        results[gb] = {}
        for peer in ([FLOORS] if lean else []) + args.peers.split(","):
            print(f"[{gb:g} GB] {peer} ...", flush=True)
            t0 = time.perf_counter()
            r = run_peer(
                peer, gb, repeats, args.device, args.tensor_mb,
                floors="none" if lean else "full", paired=not lean, timeout_s=timeout_s,
            )  # fmt: skip
            r["wall_s"] = time.perf_counter() - t0
            if peer == FLOORS:
                floors[gb] = {} if "missing" in r else r
            else:
                r = results[gb][peer] = merged(r, floors.get(gb, {}))
            print(summary(gb, peer, r), flush=True)
            if args.json:
                write_json(args.json, results, floors, meta)
    return results


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
    parser.add_argument(
        "--mode", choices=("auto", "full", "lean"), default="auto",
        help="full: every save paired with floors measured around it (slow: tens of writes of"
        " the state); lean: the floors once per size; auto: full on cpu, lean on a device",
    )  # fmt: skip
    parser.add_argument(
        "--peer-timeout-s", type=float, default=None,
        help="wall-clock limit of each peer's worker (default 120 lean, 1800 full); a peer"
        " past it is killed and reported as timed out, and the rest still run",
    )  # fmt: skip
    parser.add_argument("--markdown", type=Path, default=None, help="Also write a table here.")
    parser.add_argument(
        "--json", type=Path, default=None,
        help="write every figure here, per size and peer (rewritten as each peer ends)",
    )  # fmt: skip
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-floors", default="full", help=argparse.SUPPRESS)
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
        paired = resolve_mode(args.mode, args.device) == "full"
        result = worker(
            args.worker, args.gb, args.repeats, args.device, args.tensor_mb,
            args.worker_floors, paired,
        )  # fmt: skip
        print("RESULT " + json.dumps(result), flush=True)
        return
    results = run_sizes(args)
    loop = None
    if args.loop_steps:
        print("[loop] ...", flush=True)
        timeout_s = max(600.0, args.peer_timeout_s or 0.0)
        loop = run_peer("loop", 0, args.loop_steps, timeout_s=timeout_s)
        loop = None if "missing" in loop else loop
    md = report(results, loop)
    if args.markdown:
        args.markdown.write_text(md + "\n")


if __name__ == "__main__":
    main()
