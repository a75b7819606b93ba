"""Health-check benchmark: time of the whole check, and emulated slow ranks found.

    nice -n 10 .venv/bin/python benchmarks/health.py              # ~2-3 min on 2 shared cores
    nice -n 10 .venv/bin/python benchmarks/health.py --calibrate  # CPU reference figures

1. Whole check: `argosy health check --json` as a user runs it (a fresh process: CLI start,
   spawned ranks, torch import in each, probes, verdict), wall time, median of --repeats.
2. Emulated slow rank: rank 1 throttled to 0.25, 0.5 and 0.75 of its speed (work inflation,
   see argosy/health/throttle.py); the factor the peer checks measure vs the one injected,
   and the verdict. Target: half speed flagged degraded with its factor within +/- 20%.
3. --calibrate: medians over --repeats healthy checks of the absolute per-rank figures,
   to put in HealthConfig.cpu (the CPU reference used as the expectation of a CPU node).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FACTORS = (0.25, 0.5, 0.75)


def check(*args: str) -> tuple[float, dict, int]:
    """One `argosy health check --json` run: wall seconds, the report, the exit code."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "argosy", "health", "check", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"health check failed (exit {done.returncode}): {done.stderr}")
    return wall, json.loads(done.stdout), done.returncode


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def whole_check(repeats: int) -> list[dict]:
    rows = []
    for _ in range(repeats):
        wall, report, code = check()
        rows.append(
            {
                "wall_s": wall,
                "inner_s": report["elapsed_s"],
                "ready_s": report["phases"].get("ranks_ready_s", float("nan")),
                "verdict": report["verdict"],
                "exit": code,
                "not_healthy": [
                    c["name"] for c in report["checks"] if c["verdict"] in ("degraded", "failed")
                ],
            }
        )
    return rows


def slow_rank(factors: tuple[float, ...], repeats: int) -> list[dict]:
    rows = []
    for factor in factors:
        for _ in range(repeats):
            wall, report, code = check("--emulate-slow", f"1:{factor}")
            checks = by_name(report)
            gemm, memory = checks["gemm_peer.rank1"], checks["memory_peer.rank1"]
            rows.append(
                {
                    "injected": factor,
                    "gemm_factor": gemm["factor"],
                    "gemm_verdict": gemm["verdict"],
                    "memory_factor": memory["factor"],
                    "memory_verdict": memory["verdict"],
                    "node_verdict": report["verdict"],
                    "exit": code,
                    "wall_s": wall,
                }
            )
    return rows


def calibrate(repeats: int) -> dict[str, float]:
    values: dict[str, list[float]] = {"gemm_tflops": [], "memory_gbps": [], "bus_gbps": []}
    for _ in range(repeats):
        _, report, _ = check()
        checks = by_name(report)
        ranks = [n.split(".")[1] for n in checks if n.startswith("gemm.rank")]
        values["gemm_tflops"] += [checks[f"gemm.{r}"]["value"] for r in ranks]
        values["memory_gbps"] += [checks[f"memory.{r}"]["value"] for r in ranks]
        values["bus_gbps"].append(checks["bus"]["value"])
    return {k: statistics.median(v) for k, v in values.items()}


def print_tables(whole: list[dict], slow: list[dict]) -> None:
    walls = [r["wall_s"] for r in whole]
    print(
        f"\nwhole check (argosy health check --json, {len(whole)} runs): median "
        f"{statistics.median(walls):.1f} s, max {max(walls):.1f} s (target < 30 s)"
    )
    print("| run | wall s | inside s | ranks ready s | verdict | exit | not healthy |")
    print("|---:|---:|---:|---:|---|---:|---|")
    for i, r in enumerate(whole):
        print(
            f"| {i} | {r['wall_s']:.1f} | {r['inner_s']:.1f} | {r['ready_s']:.1f} | "
            f"{r['verdict']} | {r['exit']} | {', '.join(r['not_healthy']) or '-'} |"
        )
    print("\nemulated slow rank 1: measured vs injected factor (target +/- 20%)")
    print(
        "| injected | gemm_peer measured | error | verdict | memory_peer measured | error | "
        "node verdict | exit | wall s |"
    )
    print("|---:|---:|---:|---|---:|---:|---|---:|---:|")
    for r in slow:
        f = r["injected"]
        print(
            f"| {f:g} | {r['gemm_factor']:.3f} | {100 * (r['gemm_factor'] / f - 1):+.1f}% | "
            f"{r['gemm_verdict']} | {r['memory_factor']:.3f} | "
            f"{100 * (r['memory_factor'] / f - 1):+.1f}% | {r['node_verdict']} | {r['exit']} | "
            f"{r['wall_s']:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case")
    parser.add_argument("--calibrate", action="store_true", help="measure the CPU reference")
    parser.add_argument("--json", action="store_true", help="print raw rows as JSON")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.calibrate:
        print(json.dumps(calibrate(args.repeats), indent=2))
        return
    whole = whole_check(args.repeats)
    slow = slow_rank(FACTORS, max(1, args.repeats - 1))
    if args.json:
        print(json.dumps({"whole": whole, "slow": slow}, indent=2))
    else:
        print_tables(whole, slow)


if __name__ == "__main__":
    main()
