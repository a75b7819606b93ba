"""Training on the accelerator for real: a SIGKILLed rank resumes bit-exact, and what it cost.

    python benchmarks/train_gpu.py --device cuda --json /tmp/train_gpu.json
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/train_gpu.py --device cpu --steps 40

Two `python -m argosy launch` runs of examples/train_gpt.py, one node, one rank, the same
seed and size: a clean run of N steps, and a run whose rank is SIGKILLed at the start of
step N/2 + 2 (`--inject kill:rank=0:step=S`: the rank sends itself SIGKILL), after flash
checkpoints every N/8 steps, so the launcher restarts it and it resumes from the newest
checkpoint. Bit-exact means the final parameters' sha256 (the script's last line) and the
loss at every step are identical in both runs. Lost time per fault is the faulty run's
wall time minus the clean run's (each timed around its launcher), over the faults;
redone steps are the steps finished before the kill that the resumed rank trains again.

Prints a table; `--json PATH` writes {"device", "steps", "bit_exact", "faults",
"lost_s_per_fault", "clean_s", "faulty_s", "redone_steps", "target_lost_s", ...}. Exit 1
when a run fails or the runs differ. Needs only `argosy` importable (PYTHONPATH is handed
to the children) and torch, not a virtual environment or the `argosy` console script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TARGET_LOST_S = 10.0
SIZES = {
    "tiny": {"dim": 64, "layers": 2, "heads": 2, "block": 32, "batch": 8},
    "small": {"dim": 128, "layers": 2, "heads": 4, "block": 64, "batch": 16},
    "medium": {"dim": 512, "layers": 6, "heads": 8, "block": 256, "batch": 32},
}
"""Model sizes (train_gpt options); small runs the whole benchmark in about a minute."""
FINAL = re.compile(r"^final step (\d+) loss (\S+) params ([0-9a-f]{64})$", re.M)
DEVICE = re.compile(r"\[rank 0\] device (.+), backend (\w+)$", re.M)


@dataclass
class Run:
    """One launcher run, as its files and its wall time tell it."""

    run_dir: Path
    wall_s: float
    returncode: int
    stderr: str

    @property
    def summary(self) -> dict:
        path = self.run_dir / "summary.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @property
    def events(self) -> list[dict]:
        path = self.run_dir / "events.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def rank0_log(self) -> str:
        logs = sorted((self.run_dir / "logs").glob("attempt*/rank0.log"), key=_attempt)
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def final(self) -> tuple[float, str] | None:
        """(last loss, sha256 of the parameters) from rank 0's last attempt."""
        found = FINAL.findall(self.rank0_log())
        return (float(found[-1][1]), found[-1][2]) if found else None

    def device(self) -> tuple[str, str]:
        found = DEVICE.findall(self.rank0_log())
        return found[-1] if found else ("?", "?")

    def losses(self) -> dict[int, float]:
        """Loss per step as the run finally kept it (a redone step's last value wins)."""
        return {e["step"]: e["loss"] for e in self.events if e["event"] == "step"}


def _attempt(path: Path) -> int:
    return int(path.parent.name.removeprefix("attempt"))


def child_env() -> dict[str, str]:
    """Ours, with the repository first on PYTHONPATH, so `-m argosy` and the ranks import it."""
    env = dict(os.environ)
    paths = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("COLUMNS", "120")
    return env


def launch(run_dir: Path, args: argparse.Namespace, inject: str | None) -> Run:
    """`python -m argosy launch` of train_gpt, one rank; timed around the launcher."""
    cmd = [sys.executable, "-m", "argosy", "launch", "--quiet", "--nproc-per-node", "1"]
    cmd += ["--run-dir", str(run_dir), "--max-restarts", "2"]
    cmd += ["--inject", inject] if inject else []
    cmd += [str(EXAMPLE), *train_args(args)]
    t0 = time.perf_counter()
    done = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=args.timeout
    )
    return Run(run_dir, time.perf_counter() - t0, done.returncode, done.stderr + done.stdout)


def train_args(args: argparse.Namespace) -> list[str]:
    out = ["--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every)]
    out += ["--device", args.device, "--seed", str(args.seed)]
    for key, value in SIZES[args.model_size].items():
        out += [f"--{key}", str(value)]
    return out


def redone_steps(run: Run) -> tuple[int, int, int | None]:
    """(steps redone, the step resumed from, the newest step on disk then) of the first fault."""
    resumes = [e for e in run.events if e["event"] == "resume" and e["attempt"] > 0]
    if not resumes:
        return 0, 0, None
    resumed = resumes[0]["step"]
    before = [e["step"] for e in run.events if e["event"] == "step" and e["attempt"] == 0]
    ranks = (resumes[0].get("decision") or {}).get("ranks") or [{}]
    on_disk = ranks[0].get("disk") or []
    return max(0, max(before, default=0) - resumed), resumed, max(on_disk, default=None)


def after_resume(clean: Run, faulty: Run, resumed: int) -> dict[str, float]:
    """Seconds of the steps after the resume point: the faulty run's last attempt from its
    resume to its last step, and the clean run's same steps. More in the faulty run is
    lost time none of the causes names (an attempt's first steps run slower: its
    checkpoint persister starting beside them, warm-up)."""
    out = {}
    for name, run in (("clean", clean), ("faulty", faulty)):
        events = run.events
        last = max((e["attempt"] for e in events if e["event"] == "step"), default=0)
        ends = {e["step"]: e["t"] for e in events if e["event"] == "step" and e["attempt"] == last}
        starts = {e["attempt"]: e["t"] for e in events if e["event"] == "resume"}
        begin = starts.get(last, 0.0) if name == "faulty" else ends.get(resumed, 0.0)
        out[name] = round(max(ends.values(), default=begin) - begin, 3)
    return out


def compare(clean: Run, faulty: Run, args: argparse.Namespace) -> dict:
    """The result record (see the module docstring)."""
    faults = len(faulty.summary.get("faults", []))
    redone, resumed, committed = redone_steps(faulty)
    a, b = clean.final(), faulty.final()
    same_losses = clean.losses() == faulty.losses() and len(clean.losses()) == args.steps
    device, backend = clean.device()
    return {
        "device": device,
        "backend": backend,
        "model_size": args.model_size,
        "steps": args.steps,
        "bit_exact": a is not None and a == b and same_losses,
        "params_sha256": {"clean": a and a[1], "faulty": b and b[1]},
        "final_loss": {"clean": a and a[0], "faulty": b and b[0]},
        "losses_equal": same_losses,
        "faults": faults,
        "killed_at_step": args.kill_step,
        "resumed_from_step": resumed,
        "committed_step_at_resume": committed,
        "lost_s_per_fault": (faulty.wall_s - clean.wall_s) / max(faults, 1),
        "lost_s_by_cause": faulty.summary.get("lost_s", {}),
        "clean_s": clean.wall_s,
        "faulty_s": faulty.wall_s,
        "redone_steps": redone,
        "after_resume_s": after_resume(clean, faulty, resumed),
        "target_lost_s": TARGET_LOST_S,
        "run_dirs": {"clean": str(clean.run_dir), "faulty": str(faulty.run_dir)},
    }


def show(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"train_gpt on {result['device']} ({result['backend']}), one SIGKILL")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("note")
    r = result
    lost, target = r["lost_s_per_fault"], r["target_lost_s"]
    sha = r["params_sha256"]
    causes = ", ".join(f"{k} {v:.2f} s" for k, v in r["lost_s_by_cause"].items())
    rows = [
        (
            "bit-exact resume",
            "[green]yes[/]" if r["bit_exact"] else "[red]NO[/]",
            f"params sha256 {str(sha['clean'])[:12]} / {str(sha['faulty'])[:12]}, "
            f"every loss equal: {r['losses_equal']}",
        ),
        ("clean run", f"{r['clean_s']:.2f} s", f"{r['steps']} steps, {r['model_size']} model"),
        ("faulty run", f"{r['faulty_s']:.2f} s", f"{r['faults']} fault(s)"),
        (
            "lost per fault",
            f"[{'green' if lost <= target else 'red'}]{lost:.2f} s[/]",
            f"target <= {target:g} s",
        ),
        (
            "killed at / resumed from",
            f"{r['killed_at_step']} / {r['resumed_from_step']}",
            f"newest committed step at resume: {r['committed_step_at_resume']}",
        ),
        ("redone steps", str(r["redone_steps"]), ""),
        (
            "steps after the resume",
            f"{r['after_resume_s']['faulty']:.2f} s",
            f"the same steps in the clean run: {r['after_resume_s']['clean']:.2f} s",
        ),
        ("lost by cause", "", causes),
    ]
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--steps", type=int, default=40, help="training steps per run")
    p.add_argument("--model-size", default="small", choices=tuple(SIZES))
    p.add_argument("--ckpt-every", type=int, default=None, help="default: steps / 8")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--run-root", type=Path, default=None, help="default: a new temp dir")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    args = p.parse_args(argv)
    args.ckpt_every = args.ckpt_every or max(1, args.steps // 8)
    args.kill_step = args.steps // 2 + 2
    if not args.ckpt_every < args.kill_step <= args.steps:
        p.error(
            f"--steps {args.steps}: the kill at step {args.kill_step} must come after the "
            f"first checkpoint (step {args.ckpt_every}) and within the run; use more steps"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = args.run_root or Path(tempfile.mkdtemp(prefix="argosy-train-gpu-"))
    root.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name, inject in (("clean", None), ("faulty", f"kill:rank=0:step={args.kill_step}")):
        print(f"{name} run: {root / name}", file=sys.stderr, flush=True)
        run = launch(root / name, args, inject)
        if run.returncode != 0 or run.final() is None:
            print(f"{name} run failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
            print(run.rank0_log()[-3000:])
            return 1
        runs[name] = run
    result = compare(runs["clean"], runs["faulty"], args)
    show(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["bit_exact"] and result["faults"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
