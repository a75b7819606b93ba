"""Mixed-chip training on CPU with EMULATED chips: argosy's plans against their peers.

    .venv/bin/python benchmarks/mixed.py                  # 30 steps per run, ~8 minutes
    .venv/bin/python benchmarks/mixed.py --steps 12       # quick

Every training run is a real `argosy launch` of examples/train_mixed.py (gloo ranks on the
host CPU, chips emulated by throttling: argosy.runtime.mixed.emulate), with plans from
`argosy plan --json`. Peers in the same run:

1. exactness: the planner's mixed plan on H100 x1 + A100 x2 (uneven shares, sample-
   weighted gradients, hierarchical all-reduce) against a uniform 3-rank run with the
   same global batch; relative loss difference after --steps steps (target 1e-5).
2. gain on a 2:1 speed mix (A100 + H20, catalog peaks 312 / 148 TFLOPs): the planner's
   non-uniform split against an even split of the same global batch, --repeats pairs
   run interleaved (the shared host's load drifts); median measured gain vs
   the planner's predicted gain (its per-group rates, linear in samples), and measured
   throughput vs the planner's prediction scaled to this host (report.py). Target: both
   within 10%.
3. efficiency on the 3-rank mix (run 1): measured throughput / sum of the groups' solo
   throughputs (each group's samples / its busy time per step, in the same run, so CPU
   contention weighs on both sides alike). Target >= 95%.
4. hierarchical all-reduce bus bandwidth vs the slowest link's floor (mixed_allreduce.py).
   Target >= 80%.
The emulation's own overhead (sleep beyond what the throttle asked) is reported per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "examples" / "train_mixed.py")
MIX3 = ("h100:1+a100-80g:2", "h100:1,a100-80g:2")
MIX2 = ("a100-80g:1+h20:1", "a100-80g:1,h20:1")


HEADROOM = {"value": "4"}


def argosy(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "ARGOSY_EMULATE_HEADROOM": HEADROOM["value"]}
    cmd = [sys.executable, "-m", "argosy", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, check=False)


def make_plan(cluster: str, global_batch: int, out: Path) -> dict:
    args = ["plan", "-m", "gpt-1.7b", "-c", cluster, "--global-batch", str(global_batch)]
    done = argosy(*args, "--seq-len", "2048", "--json")
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    out.write_text(done.stdout)
    return json.loads(done.stdout)


def even_split(plan: dict, out: Path) -> dict:
    """The same plan with the global batch split evenly over the groups (the peer)."""
    data = json.loads(json.dumps(plan))
    groups = data["plans"][0]["groups"]
    share = data["global_batch"] // len(groups)
    for g in groups:
        g["batch_share"] = share
    out.write_text(json.dumps(data))
    return data


def launch(run_dir: Path, nproc: int, steps: int, *args: str, script: tuple = ()) -> dict:
    head = ["launch", "--quiet", "--run-dir", str(run_dir), "--nproc-per-node", str(nproc)]
    tail = [SCRIPT, "--steps", str(steps), "--ckpt-every", "100000", *script]
    start = time.perf_counter()
    done = argosy(*head, *args, *tail)
    if done.returncode != 0:
        raise SystemExit(f"{run_dir.name}: {done.stdout}{done.stderr}")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["losses"] = _losses(run_dir)
    summary["launch_s"] = time.perf_counter() - start
    return summary


def _losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "step":
            out[e["step"]] = e["loss"]
    return out


def predicted_gain(plan: dict) -> float:
    """Planner's step time of an even split / of its own split, from its per-group rates
    (samples / group step time, linear in samples), the cross-group sync as planned."""
    entry = plan["plans"][0]
    groups = entry["groups"]
    share = plan["global_batch"] // len(groups)
    rates = [g["batch_share"] / g["step_time_s"] for g in groups]
    compute = max(g["step_time_s"] for g in groups)
    sync = entry["predicted"]["step_time_s"] - compute
    even = max(share / r for r in rates) + sync
    return even / entry["predicted"]["step_time_s"]


def run(steps: int, mib: float, repeats: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="argosy-mixed-bench-"))
    plan3 = make_plan(MIX3[0], 36, work / "plan3.json")
    plan2 = make_plan(MIX2[0], 36, work / "plan2.json")
    even_split(plan2, work / "plan2-even.json")
    emulate3, emulate2 = ("--emulate-chips", MIX3[1]), ("--emulate-chips", MIX2[1])
    runs = {
        "mixed3": launch(work / "mixed3", 3, steps, "--plan", str(work / "plan3.json"), *emulate3),
        "uniform3": launch(work / "uniform3", 3, steps, script=("--global-batch", "36")),
    }
    gains = []
    for i in range(repeats):  # interleaved: the host's load drifts over minutes
        for name, plan in (("planned2", "plan2.json"), ("even2", "plan2-even.json")):
            key = name if i == 0 else f"{name}.{i}"
            runs[key] = launch(work / key, 2, steps, "--plan", str(work / plan), *emulate2)
        rate = [runs[k]["throughput"]["measured_samples_per_s"] for k in _pair(i)]
        gains.append(rate[0] / rate[1])
    from mixed_allreduce import measure

    allreduce = measure([0, 1, 1], mib=mib, repeats=5)
    return {
        "steps": steps,
        "runs": runs,
        "gains": gains,
        "allreduce": allreduce,
        "plan2": plan2,
        "plan3": plan3,
    }


def _pair(i: int) -> tuple[str, str]:
    return ("planned2", "even2") if i == 0 else (f"planned2.{i}", f"even2.{i}")


def figures(result: dict) -> list[tuple[str, str, str, str, bool]]:
    """(figure, measured, target, ratio, met) rows."""
    runs = result["runs"]
    last = result["steps"]
    mixed, uniform = runs["mixed3"]["losses"][last], runs["uniform3"]["losses"][last]
    rel = abs(mixed - uniform) / abs(uniform)
    t3 = runs["mixed3"]["throughput"]
    tp = runs["planned2"]["throughput"]
    gain = statistics.median(result["gains"])
    want_gain = predicted_gain(result["plan2"])
    vs_pred = tp["measured_samples_per_s"] / tp["predicted_samples_per_s"]
    ar = result["allreduce"]
    return [
        (f"loss, mixed vs uniform, step {last}", f"{rel:.1e} rel", "<= 1e-5", "", rel <= 1e-5),
        (
            f"gain, planned vs even split (2:1 mix), median of {len(result['gains'])}",
            f"{gain:.3f}x",
            f"planner {want_gain:.3f}x",
            f"{gain / want_gain:.3f}",
            abs(gain / want_gain - 1) <= 0.10,
        ),
        (
            "throughput vs planner (2:1, planned)",
            f"{tp['measured_samples_per_s']:.1f}/s",
            f"{tp['predicted_samples_per_s']:.1f}/s",
            f"{vs_pred:.3f}",
            abs(vs_pred - 1) <= 0.10,
        ),
        (
            "throughput vs planner (3-rank mix)",
            f"{t3['measured_samples_per_s']:.1f}/s",
            f"{t3['predicted_samples_per_s']:.1f}/s",
            f"{t3['measured_samples_per_s'] / t3['predicted_samples_per_s']:.3f}",
            abs(t3["measured_samples_per_s"] / t3["predicted_samples_per_s"] - 1) <= 0.10,
        ),
        (
            "efficiency vs solo sum (3-rank mix)",
            f"{t3['efficiency_vs_solo_sum']:.1%}",
            ">= 95%",
            "",
            t3["efficiency_vs_solo_sum"] >= 0.95,
        ),
        (
            "hierarchical busbw vs link floor",
            f"{ar['hierarchical_busbw_gbps']:.2f} GB/s",
            f"link {ar['link_gbps']:.2f} GB/s",
            f"{ar['hierarchical_vs_link']:.2f}",
            ar["hierarchical_vs_link"] >= 0.80,
        ),
    ]


def show(result: dict, console: Console) -> None:
    title = f"mixed-chip training, CPU, EMULATED chips ({result['steps']} steps, "
    table = Table(title=title + f"headroom {result['headroom']})")
    for column in ("figure", "measured", "target / peer", "ratio", "met"):
        table.add_column(column)
    for name, measured, target, ratio, met in figures(result):
        table.add_row(name, measured, target, ratio, "yes" if met else "NO")
    console.print(table)
    detail = Table(title="runs")
    for column in (
        "run",
        "samples/s",
        "predicted",
        "eff. vs solo",
        "wait ms/step",
        "lost ms/step: imbalance / sync",
        "emulation oversleep ms/step",
        "busy s/step by group",
    ):
        detail.add_column(column)
    for name, summary in result["runs"].items():
        t = summary.get("throughput") or {}
        if "by_group" not in t:
            detail.add_row(name, "-", "-", "-", "-", "-", "-", "no throughput section")
            continue
        pred = t.get("predicted_samples_per_s")
        busy = " / ".join(f"{g['chip']} {g['busy_s_per_step']:.3f}" for g in t["by_group"])
        detail.add_row(
            name,
            f"{t['measured_samples_per_s']:.1f}",
            f"{pred:.1f}" if pred else "-",
            f"{t['efficiency_vs_solo_sum']:.1%}",
            f"{t['cross_group_wait_s_per_step'] * 1e3:.1f}",
            " / ".join(f"{v * 1e3:.1f}" for v in t["lost_s_per_step"].values()),
            f"{t['emulation_oversleep_s_per_step'] * 1e3:.2f}",
            busy,
        )
    console.print(detail)
    console.print("gains per interleaved pair: " + ", ".join(f"{g:.3f}" for g in result["gains"]))
    for name in ("mixed3", "planned2", "even2"):
        t = result["runs"][name].get("throughput", {})
        if t.get("emulated"):
            console.print(f"{name}: {t['emulated']['note']}", highlight=False, markup=False)
            break
    ar = result["allreduce"]
    console.print(
        f"all-reduce {ar['mib']:.0f} MiB over groups {ar['groups']}: "
        f"link {ar['link_s'] * 1e3:.1f} ms,"
        f" flat {ar['flat_s'] * 1e3:.1f} ms, hierarchical {ar['hierarchical_s'] * 1e3:.1f} ms "
        f"({ar['hierarchical_vs_flat']:.2f}x flat)",
        highlight=False,
    )
    load = os.getloadavg()
    console.print(f"host: {os.cpu_count()} cores, load average {load[0]:.1f} (shared machine)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--mib", type=float, default=16.0, help="all-reduce tensor size")
    p.add_argument("--repeats", type=int, default=3, help="planned/even pairs, interleaved")
    p.add_argument("--headroom", default="4", help="emulation's common slowdown (>= 1)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    HEADROOM["value"] = args.headroom
    result = run(args.steps, args.mib, args.repeats)
    result["headroom"] = args.headroom
    result["load_average"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    show(result, Console())


if __name__ == "__main__":
    main()
