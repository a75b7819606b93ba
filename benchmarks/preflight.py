"""Preflight benchmark: what `argosy launch --preflight` costs and whether it picks right.

    nice -n 10 .venv/bin/python benchmarks/preflight.py --repeats 3   # ~2 min on 2 shared cores

Side by side in one run, each a fresh process as a user runs it, on the same one-line
script (no torch in the script, so the figures are the launchers' own):

1. torchrun (`python -m torch.distributed.run --nproc-per-node 1`), the peer;
2. `argosy launch --nproc-per-node 1`;
3. `argosy launch --preflight --nproc-per-node 1` (the node check on one device first);
4. `argosy launch --preflight --nproc-per-node 1 --spares 1 --emulate-slow 1:0.5`: two
   devices checked, device 1 throttled to half speed; it must be left out, with the factor
   the peer check measured (target: 0.5 +/- 20%).

Prints medians of wall seconds, ratios to torchrun and to the plain launch, and the
exclusion results; `--json` prints them as one document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = (
    "import os\nprint('rank', os.environ['RANK'], 'devices', os.environ.get('ARGOSY_DEVICES'))\n"
)


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    return time.perf_counter() - start, done


def variants(script: Path, run_dir: Path) -> dict[str, list[str]]:
    argosy = [sys.executable, "-m", "argosy", "launch", "--quiet", "--nproc-per-node", "1"]
    return {
        "torchrun": [
            *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"),
            str(script),
        ],
        "argosy launch": [*argosy, "--run-dir", str(run_dir / "plain"), str(script)],
        "argosy launch --preflight": [
            *argosy,
            *("--preflight", "--run-dir", str(run_dir / "preflight"), str(script)),
        ],
        "--preflight, 1 spare, device 1 at 0.5": [
            *argosy,
            *("--preflight", "--spares", "1", "--emulate-slow", "1:0.5"),
            *("--run-dir", str(run_dir / "slow"), str(script)),
        ],
    }


def exclusion(run: Path) -> dict:
    """What the slow-device launch recorded: devices used, left out, the measured factor."""
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    pre = next(e for e in events if e["event"] == "preflight")
    factors = {c["name"]: c["factor"] for c in pre["checks"]}
    return {
        "use": pre["use"],
        "excluded": [x["device"] for x in pre["excluded"]],
        "gemm_peer_factor": factors.get("gemm_peer.rank1"),
        "memory_peer_factor": factors.get("memory_peer.rank1"),
        "node_verdict": pre["verdict"],
        "check_s": pre["elapsed_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    walls: dict[str, list[float]] = {}
    picks = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "one_line.py"
        script.write_text(SCRIPT)
        for _ in range(args.repeats):
            for name, cmd in variants(script, Path(tmp)).items():
                wall, done = timed(cmd)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr[-2000:]}")
                walls.setdefault(name, []).append(wall)
            picks.append(exclusion(Path(tmp) / "slow"))
    report = _report(walls, picks)
    print(json.dumps(report, indent=2) if args.json else _table(report))


def _report(walls: dict[str, list[float]], picks: list[dict]) -> dict:
    medians = {name: statistics.median(w) for name, w in walls.items()}
    peer, plain = medians["torchrun"], medians["argosy launch"]
    return {
        "wall_s": {n: [round(x, 2) for x in w] for n, w in walls.items()},
        "median_s": {n: round(m, 2) for n, m in medians.items()},
        "vs_torchrun": {n: round(m / peer, 2) for n, m in medians.items()},
        "preflight_adds_s": round(medians["argosy launch --preflight"] - plain, 2),
        "exclusions": picks,
        "right_device_left_out": sum(p["excluded"] == [1] and p["use"] == [0] for p in picks),
    }


def _table(report: dict) -> str:
    lines = ["| launcher | median wall s | x torchrun | runs |", "|---|---:|---:|---|"]
    for name, median in report["median_s"].items():
        runs = ", ".join(f"{x:.1f}" for x in report["wall_s"][name])
        lines.append(f"| {name} | {median:.2f} | {report['vs_torchrun'][name]:.2f} | {runs} |")
    lines.append(f"\npreflight adds {report['preflight_adds_s']:.1f} s (median) to a launch")
    lines += ["", "| used | left out | gemm_peer | memory_peer | node | check s |"]
    lines.append("|---|---|---:|---:|---|---:|")
    for p in report["exclusions"]:
        lines.append(
            f"| {p['use']} | {p['excluded']} | {p['gemm_peer_factor']:.3f} | "
            f"{p['memory_peer_factor']:.3f} | {p['node_verdict']} | {p['check_s']:.1f} |"
        )
    total = len(report["exclusions"])
    lines.append(f"\nright device left out: {report['right_device_left_out']} of {total}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
