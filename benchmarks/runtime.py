"""Runtime benchmark: fault detection latency, lost time per fault, goodput, exact resume.

    .venv/bin/python benchmarks/runtime.py                 # full: ~20 min, 10-minute goodput run
    .venv/bin/python benchmarks/runtime.py --periodic-min 3 --repeats 2   # shorter

All runs are `argosy launch` of examples/train_gpt.py on CPU, 2 ranks, gloo. Peers in the
same run: torchrun (torch.distributed.run, the same script, the same checkpoints) for
recovery from a killed rank, and for a hung rank (torchrun sees a hang only when the
process-group timeout fires; the script here sets it to --peer-pg-timeout seconds, where
PyTorch's defaults are 30 min for gloo and 10 min for NCCL). Prints medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "train_gpt.py")
PY = sys.executable
FAULTS = {
    "kill": "kill:rank=1:step=30",
    "exit": "exit:rank=0:step=30:code=1",
    "hang": "hang:rank=0:step=30",
    "straggler": "slow:rank=1:factor=2:from_step=10",
}
STEPS = {"straggler": 600}  # long enough to outlast straggler_confirm_s (5 s); others 60


def train_args(steps: int, ckpt_every: int, ckpt_dir: Path | None = None) -> list[str]:
    args = [EXAMPLE, "--steps", str(steps), "--ckpt-every", str(ckpt_every)]
    args += ["--checkpointer", os.environ.get("BENCH_CHECKPOINTER", "auto")]
    return args + (["--ckpt-dir", str(ckpt_dir)] if ckpt_dir else [])


def argosy_run(run: Path, steps: int, ckpt_every: int, injects: list[str], flags=()) -> dict:
    cmd = [PY, "-m", "argosy", "launch", "--quiet", "--nproc-per-node", "2", "--run-dir", str(run)]
    for spec in injects:
        cmd += ["--inject", spec]
    subprocess.run(
        [*cmd, *flags, *train_args(steps, ckpt_every)], cwd=REPO, check=False, capture_output=True
    )
    return json.loads((run / "summary.json").read_text())


def losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "step":
            out[e["step"]] = e["loss"]
    return out


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def detection(tmp: Path, repeats: int, baseline: dict[int, float], kinds: list[str]) -> dict:
    """Detection latency and lost time per fault kind, over `repeats` runs each."""
    out: dict[str, dict] = {}
    for kind in kinds:
        spec = FAULTS[kind]
        rows = []
        for i in range(repeats):
            run = tmp / f"{kind}-{i}"
            s = argosy_run(run, STEPS.get(kind, 60), 10, [spec])
            f = next(
                (f for f in s["faults"] if f["kind"] in ("crash", "exit", "hang", "straggler")),
                None,
            )
            same = losses(run) == baseline if kind != "straggler" else None
            rows.append({"fault": f, "same_losses": same, "summary": s})
        latencies = [r["fault"]["detect_latency_s"] for r in rows if r["fault"]]
        right_rank = all(
            r["fault"] and r["fault"]["rank"] == int(spec.split("rank=")[1][0]) for r in rows
        )
        lost = {}
        for cause in ("detection", "restart", "reload", "redone"):
            vals = [
                r["fault"]["lost_s"][cause] for r in rows if r["fault"] and "lost_s" in r["fault"]
            ]
            lost[cause] = med(vals)
        out[kind] = {
            "detect_latency_s": med(latencies),
            "detect_latency_all": latencies,
            "right_rank": right_rank,
            "lost_s": lost,
            "lost_total_s": sum(v for v in lost.values() if v == v),
            "losses_equal_fault_free": [r["same_losses"] for r in rows],
            "slowdown": [r["fault"].get("slowdown") for r in rows if r["fault"]],
        }
    return out


def _rank_pids(parent: int) -> dict[int, int]:
    """RANK -> pid of the processes whose environment says they are ranks, under `parent`."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat[1])
        ranks = [e for e in env if e.startswith(b"RANK=")]
        if ranks and (ppid == parent or _is_descendant(int(entry.name), parent)):
            if any(e.startswith(b"ARGOSY_PERSISTER") for e in env):
                continue
            out.setdefault(int(ranks[0][5:]), int(entry.name))
    return out


def _is_descendant(pid: int, ancestor: int) -> bool:
    for _ in range(5):
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid == ancestor:
            return True
    return False


def _step_times(text: str) -> list[tuple[int, float]]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0] == "step" and parts[4] == "t":
            out.append((int(parts[1]), float(parts[5])))
    return out


def _reader(log: Path, run_dir: Path | None):  # noqa: ANN202
    """Rank 0's output: torchrun's own stdout, or argosy's per-attempt rank logs."""
    if run_dir is None:
        return log.read_text
    return lambda: "".join(
        p.read_text() for p in sorted((run_dir / "logs").glob("attempt*/rank0.log"))
    )


def external_kill(
    cmd: list[str], log: Path, at_step: int, rank: int, sig: int, run_dir: Path | None = None
) -> dict:
    """Start `cmd`, send `sig` to `rank` once rank 0 printed `at_step`, time the recovery."""
    read = _reader(log, run_dir)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        fired_at = None
        while proc.poll() is None:
            time.sleep(0.05)
            steps = _step_times(read())
            if fired_at is None and steps and steps[-1][0] >= at_step:
                pids = _rank_pids(proc.pid)
                if rank in pids:
                    os.kill(pids[rank], sig)
                    fired_at = time.time()
        proc.wait()
    steps = _step_times(read())
    after = [t for _, t in steps if fired_at and t > fired_at]
    killed_step = max((s for s, t in steps if fired_at and t <= fired_at), default=0)
    resumed = [s for s, t in steps if fired_at and t > fired_at]
    return {
        "recovery_s": (after[0] - fired_at) if after else float("nan"),
        "killed_after_step": killed_step,
        "first_step_after": resumed[0] if resumed else None,
        "final_step": steps[-1][0] if steps else 0,
    }


def peers(tmp: Path, repeats: int, pg_timeout: float) -> dict:
    """Kill and hang recovery, argosy launch vs torchrun, same script and checkpoints."""
    out: dict[str, dict] = {"kill": {"argosy": [], "torchrun": []}, "hang": {}}
    for i in range(repeats):
        for name in ("argosy", "torchrun"):
            ckpt = tmp / f"peer-{name}-{i}-ckpt"
            run_dir = tmp / f"peer-argosy-{i}" if name == "argosy" else None
            if name == "argosy":
                cmd = [
                    PY,
                    "-m",
                    "argosy",
                    "launch",
                    "--quiet",
                    "--nproc-per-node",
                    "2",
                    "--max-restarts",
                    "1",
                    "--run-dir",
                    str(run_dir),
                ]
            else:
                cmd = [
                    PY,
                    "-m",
                    "torch.distributed.run",
                    "--nproc-per-node",
                    "2",
                    "--max-restarts",
                    "1",
                    "--standalone",
                ]
            cmd += train_args(60, 10, ckpt) + ["--pg-timeout", str(pg_timeout)]
            log = tmp / f"peer-{name}-{i}.log"
            res = external_kill(cmd, log, 30, 1, signal.SIGKILL, run_dir)
            out["kill"][name].append(res)
    # a hang: SIGSTOP freezes rank 1 the way a wedged device would
    for name in ("argosy", "torchrun"):
        ckpt = tmp / f"hang-{name}-ckpt"
        run_dir = tmp / "hang-argosy" if name == "argosy" else None
        if name == "argosy":
            cmd = [
                PY,
                "-m",
                "argosy",
                "launch",
                "--quiet",
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "1",
                "--run-dir",
                str(run_dir),
            ]
        else:
            cmd = [
                PY,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "1",
                "--standalone",
            ]
        cmd += train_args(60, 10, ckpt) + ["--pg-timeout", str(pg_timeout)]
        log = tmp / f"hang-{name}.log"
        out["hang"][name] = external_kill(cmd, log, 30, 1, signal.SIGSTOP, run_dir)
    return out


def periodic(tmp: Path, minutes: float, every_s: float) -> dict:
    """A run of about `minutes` with a fault injected every `every_s` seconds."""
    probe = argosy_run(tmp / "probe", 200, 50, [])
    step_s = probe["productive_s"] / max(probe["final_step"], 1)
    steps = int(minutes * 60 / step_s)
    kinds = ["kill:rank=1", "hang:rank=0", "exit:rank=0:code=1", "kill:rank=0"]
    injects, t = [], every_s
    while t < minutes * 60 - 10:
        injects.append(f"{kinds[len(injects) % len(kinds)]}:at_s={t:g}")
        t += every_s
    run = tmp / "periodic"
    s = argosy_run(run, steps, 50, injects, flags=["--max-restarts", str(len(injects) + 2)])
    return {"steps": steps, "step_s": step_s, "injects": injects, "summary": s, "run": str(run)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--periodic-min", type=float, default=10.0)
    p.add_argument("--every-s", type=float, default=120.0)
    p.add_argument("--peer-pg-timeout", type=float, default=30.0)
    p.add_argument("--peer-repeats", type=int, default=2)
    p.add_argument("--kinds", nargs="*", default=list(FAULTS), choices=list(FAULTS))
    p.add_argument("--skip", nargs="*", default=[], choices=["detection", "peers", "periodic"])
    p.add_argument("--out", default=None, help="also write the raw results as JSON here")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="argosy-bench-runtime-"))
    results: dict = {"machine": f"{os.cpu_count()} cores, no GPU", "tmp": str(tmp)}
    base = argosy_run(tmp / "baseline", 60, 10, [])
    baseline = losses(tmp / "baseline")
    results["baseline"] = {k: base[k] for k in ("wall_s", "productive_s", "final_loss")}
    if "detection" not in args.skip:
        results["detection"] = detection(tmp, args.repeats, baseline, args.kinds)
        report_detection(results["detection"])
    if "peers" not in args.skip:
        results["peers"] = peers(tmp, args.peer_repeats, args.peer_pg_timeout)
        report_peers(results["peers"], args.peer_pg_timeout)
    if "periodic" not in args.skip:
        results["periodic"] = periodic(tmp, args.periodic_min, args.every_s)
        report_periodic(results["periodic"])
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))


def report_detection(d: dict) -> None:
    print("\n== detection latency and lost time per fault (2 ranks, CPU, median) ==")
    print(
        f"{'fault':10} {'detect s':>9} {'rank ok':>8} {'detect':>7} {'restart':>8} "
        f"{'reload':>7} {'redone':>7} {'total':>7}  same losses"
    )
    for kind, r in d.items():
        lost = r["lost_s"]
        print(
            f"{kind:10} {r['detect_latency_s']:9.2f} {str(r['right_rank']):>8} "
            f"{lost['detection']:7.2f} {lost['restart']:8.2f} {lost['reload']:7.2f} "
            f"{lost['redone']:7.2f} {r['lost_total_s']:7.2f}  {r['losses_equal_fault_free']}"
        )
    if "straggler" in d:
        print("straggler slowdown reported:", d["straggler"]["slowdown"])


def report_peers(p: dict, pg_timeout: float) -> None:
    print("\n== recovery, argosy launch vs torchrun (same script; kill -> first step after) ==")
    a = med([r["recovery_s"] for r in p["kill"]["argosy"]])
    t = med([r["recovery_s"] for r in p["kill"]["torchrun"]])
    print(f"kill rank 1: argosy {a:.2f} s, torchrun {t:.2f} s, ratio torchrun/argosy {t / a:.2f}")
    ha, ht = p["hang"]["argosy"]["recovery_s"], p["hang"]["torchrun"]["recovery_s"]
    print(
        f"hang rank 1 (SIGSTOP): argosy {ha:.2f} s, torchrun {ht:.2f} s "
        f"(pg timeout {pg_timeout:g} s), ratio {ht / ha:.2f}"
    )


def report_periodic(r: dict) -> None:
    s = r["summary"]
    print(
        f"\n== goodput: {s['wall_s']:.0f} s run, {len(r['injects'])} faults "
        f"({', '.join(r['injects'])}) =="
    )
    print(
        f"effective training time {s['effective_training_time']:.2%}; "
        f"lost by cause {s['lost_s']}; restarts {s['restarts']}; final step {s['final_step']}"
    )
    for f in s["faults"]:
        print(
            f"  {f['kind']:9} rank {f['rank']} detect {f['detect_latency_s']:.2f} s, "
            f"lost {f.get('lost_s')}"
        )


if __name__ == "__main__":
    main()
