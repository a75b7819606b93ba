"""Fault soak: checkpoint integrity over many injected faults (issue 15 and 17 targets).

    .venv/bin/python benchmarks/soak.py --faults 1000 --json         # the >= 1,000-fault soak
    .venv/bin/python benchmarks/soak.py --faults 1000 --storm-faults 10 --json
    .venv/bin/python benchmarks/soak.py storm --faults 40 --busy 2   # multi-rank kill storm
    .venv/bin/python benchmarks/soak.py launch --runs 16             # the issue's reproduction

default (no mode): `argosy.checkpoint.soak`, the fast soak: one long-lived checkpointer,
faults injected into its persister (SIGKILL at random moments and at named points, hangs),
its trainer connection, its file system (full: a small tmpfs when mountable, else injected
ENOSPC) and its committed files (torn, corrupted shard, torn manifest); every restore
checked byte for byte. `--storm-faults K` runs K of the faults through the storm below
(2 real ranks, SIGKILLed; ~30 s per fault) for coverage of the multi-rank path. Prints
`faults`, `restores`, `torn`, `lost`, `wrong_restores`, `steps_lost_per_fault` (JSON with
`--json`); exits 1 when any of torn, lost, wrong_restores is not 0.

storm: `argosy.checkpoint.chaos` (the harness of tests/checkpoint/test_ckpt_race.py): 2 real
gloo ranks with their persisters, one SIGKILL per attempt at a random point of save /
persist / commit (a trainer at a random moment, or a persister at a crash point), `busy`
CPU hogs beside them. After every restore: ranks resumed at one step, no older than the
newest intact commit, with that step's exact bytes; every commit verifies.
Targets: 0 torn or unverifiable commits, 0 ranks resuming apart, 0 resumes older than the
newest intact commit.

launch: `argosy launch --nproc-per-node 2 examples/train_gpt.py --steps 40 --ckpt-every 5`
with two kills close together just after a checkpoint (random pair per run, as in the
issue), two busy loops beside it. A run passes when it completes with the fault-free loss
at every step, every resume was agreed by both ranks, and every kept step verifies.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from argosy.checkpoint import disk  # noqa: E402
from argosy.checkpoint.chaos import Report, busy_loops, run_storm  # noqa: E402


def _cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def storm(faults: int, chunk: int, busy: int, seed: int) -> int:
    from rich.progress import Progress

    total = Report()
    started, cpu0 = time.monotonic(), _cpu_s()
    with Progress() as bar, tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        task = bar.add_task("faults", total=faults)
        for index, first in enumerate(range(0, faults, chunk)):
            n = min(chunk, faults - first)
            got = run_storm(Path(tmp) / f"chunk{index}", faults=n, seed=seed + index, busy=busy)
            total.faults += got.faults
            total.restores += got.restores
            total.commits_verified += got.commits_verified
            total.violations += got.violations
            total.resumed_steps += got.resumed_steps
            for kind, count in got.kinds.items():
                total.kinds[kind] = total.kinds.get(kind, 0) + count
            bar.update(task, advance=n)
    wall, cpu = time.monotonic() - started, _cpu_s() - cpu0
    print(f"faults injected        {total.faults}")
    print(f"restores audited       {total.restores}")
    print(f"commits verified       {total.commits_verified} (at the end of each chunk)")
    print(f"violations             {len(total.violations)}  (target 0)")
    for v in total.violations[:20]:
        print(f"  - {v}")
    print("fault kinds            " + ", ".join(f"{k} {v}" for k, v in sorted(total.kinds.items())))
    resumed_fresh = sum(1 for s in total.resumed_steps if s == 0)
    print(f"restores at step 0     {resumed_fresh} (a fault before any common snapshot)")
    print(
        f"wall {wall:.0f} s, CPU (this process and waited children) {cpu:.0f} s, "
        f"{wall / max(1, total.faults):.1f} s wall per fault"
    )
    return 1 if total.violations else 0


def _launch(run: Path, injects: list[str], steps: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "argosy", "launch", "--quiet", "--nproc-per-node", "2"]
    for spec in injects:
        cmd += ["--inject", spec]
    cmd += ["--run-dir", str(run), str(REPO / "examples" / "train_gpt.py")]
    cmd += ["--steps", str(steps), "--ckpt-every", "5"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


def _losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "step":
            out[event["step"]] = event["loss"]
    return out


def _check_run(run: Path, want: dict[int, float]) -> list[str]:
    problems = []
    summary = json.loads((run / "summary.json").read_text())
    if summary["status"] != "completed":
        problems.append(f"status {summary['status']}: {summary.get('cause', {}).get('detail')}")
    if _losses(run) != want:
        problems.append("losses differ from the fault-free run")
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    for e in events:
        if e["event"] == "resume" and not e.get("agreed", True):
            problems.append(f"attempt {e['attempt']}: ranks resumed apart {e['rank_steps']}")
    ckpt = run / "checkpoints"
    for step in disk.committed_steps(ckpt):
        problems += disk.verify(ckpt / disk.step_dir_name(step))
    return problems


def launch(runs: int, busy: int, seed: int) -> int:
    rng = random.Random(seed)
    hogs = busy_loops(busy)
    failures, latencies, effective = [], [], []
    try:
        with tempfile.TemporaryDirectory(prefix="soak-launch-") as tmp:
            base = Path(tmp) / "fault-free"
            _launch(base, [], 40)
            want = _losses(base)
            for index in range(runs):
                first = rng.choice([5, 10, 15, 20, 25, 30]) + rng.randint(1, 2)
                second = min(39, first + rng.randint(1, 3))
                ranks = rng.sample([0, 1], 2)
                injects = [
                    f"kill:rank={ranks[0]}:step={first}",
                    f"kill:rank={ranks[1]}:step={second}",
                ]
                run = Path(tmp) / f"run{index}"
                _launch(run, injects, 40)
                problems = _check_run(run, want)
                summary = json.loads((run / "summary.json").read_text())
                effective.append(summary["effective_training_time"])
                latencies += [
                    f["detect_latency_s"]
                    for f in summary["faults"]
                    if f.get("detect_latency_s") is not None
                ]
                status = "ok" if not problems else "FAIL: " + "; ".join(problems)
                print(f"run {index:3d} {' '.join(injects):45s} {status}", flush=True)
                if problems:
                    failures.append((injects, problems))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"runs {runs}, failed {len(failures)} (target 0)")
    if latencies:
        print(
            f"detection latency median {statistics.median(latencies):.2f} s, "
            f"max {max(latencies):.2f} s over {len(latencies)} faults"
        )
    print(f"effective training time median {statistics.median(effective):.1%}")
    return 1 if failures else 0


def fast(faults: int, storm_faults: int, seed: int, as_json: bool, on_disk: bool = False) -> int:
    from rich.progress import Progress

    from argosy.checkpoint.soak import run_soak

    with Progress(transient=as_json) as bar, tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        task = bar.add_task("faults", total=faults)
        report = run_soak(
            Path(tmp) / "fast",
            faults - storm_faults,
            seed,
            on_fault=lambda r: _progress(bar, task, r),
            tmpfs=not on_disk,
        )
        if storm_faults:
            _merge_storm(report, run_storm(Path(tmp) / "storm", storm_faults, seed, busy=0))
        bar.update(task, completed=faults)
    result = report.as_dict()
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        _print_table(result)
    bad = report.torn + report.lost + report.wrong_restores
    return 1 if bad else 0


def _progress(bar: Any, task: Any, report: Any) -> None:
    bar.update(task, completed=report.faults)
    if not sys.stderr.isatty() and report.faults % 25 == 0:  # a log, when not on a terminal
        done = {k: getattr(report, k) for k in ("faults", "restores", "torn", "lost")}
        print(f"{time.strftime('%H:%M:%S')} {done} wrong {report.wrong_restores}",
              file=sys.stderr, flush=True)  # fmt: skip


def _merge_storm(report: Any, storm: Report) -> None:
    """The storm's faults and audited restores, its violations sorted into the soak's counts."""
    report.faults += storm.faults
    report.restores += storm.restores
    for kind, count in storm.kinds.items():
        report.kinds[f"storm:{kind}"] = report.kinds.get(f"storm:{kind}", 0) + count
    for violation in storm.violations:
        report.problems.append(f"storm: {violation}")
        if "older than the newest" in violation:
            report.lost += 1
        elif "checksum" in violation or "bytes" in violation or "missing" in violation:
            report.torn += 1
        else:
            report.wrong_restores += 1


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="checkpoint fault soak")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("faults", "restores", "torn", "lost", "wrong_restores", "clear_errors"):
        table.add_row(key, str(result[key]))
    table.add_row("steps_lost_per_fault", f"{result['steps_lost_per_fault']:.2f}")
    table.add_row("disk full by", result["disk_full_by"])
    table.add_row("wall s (s per fault)", f"{result['wall_s']} ({result['s_per_fault']})")
    kinds = Table(title="fault kinds")
    kinds.add_column("kind")
    kinds.add_column("count", justify="right")
    for kind, count in sorted(result["kinds"].items()):
        kinds.add_row(kind, str(count))
    console = Console()
    console.print(table, kinds)
    for problem in result["problems"][:20]:
        console.print(f"  - {problem}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=1000, help="faults to inject")
    parser.add_argument("--storm-faults", type=int, default=0, help="of them, via the storm")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--on-disk",
        action="store_true",
        help="checkpoints on the temporary directory's disk, not a small tmpfs (direct I/O"
        " in play; a full disk is an injected ENOSPC)",
    )
    sub = parser.add_subparsers(dest="mode")
    s = sub.add_parser("storm", help="kill storms through the chaos harness")
    s.add_argument("--faults", type=int, default=1000)
    s.add_argument("--chunk", type=int, default=10, help="faults per checkpoint directory")
    s.add_argument("--busy", type=int, default=1, help="CPU hogs beside the ranks")
    s.add_argument("--seed", type=int, default=1)
    lp = sub.add_parser("launch", help="the issue's two-kill reproduction through argosy launch")
    lp.add_argument("--runs", type=int, default=16)
    lp.add_argument("--busy", type=int, default=2)
    lp.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.mode is None:
        if args.faults < 1 or not 0 <= args.storm_faults <= args.faults:
            parser.error("--faults must be at least 1, --storm-faults between 0 and --faults")
        return fast(args.faults, args.storm_faults, args.seed, args.json, args.on_disk)
    if args.mode == "storm":
        return storm(args.faults, args.chunk, args.busy, args.seed)
    return launch(args.runs, args.busy, args.seed)


if __name__ == "__main__":
    sys.exit(main())
