"""Mixed-chip training on CPU with EMULATED chips: argosy's plans against their peers.

    nice -n 10 .venv/bin/python benchmarks/mixed.py              # about 30 minutes
    .venv/bin/python benchmarks/mixed.py --steps 8 --repeats 1 --skip-allreduce  # quick

Every training run is a real `argosy launch` of examples/train_mixed.py (gloo ranks on the
host CPU, chips emulated: argosy.runtime.mixed.emulate), with plans from
`argosy plan --json`. Emulated time is deadline-based: the first emulated run of a mix
calibrates the reference time per sample (x headroom) and every later run of that mix is
given the same per-chip times (ARGOSY_EMULATE_SAMPLE_S), so all peers share one time
scale. Peers in the same run:

1. exactness: the planner's mixed plan on H100 x1 + A100 x2 (uneven shares, sample-
   weighted gradients, hierarchical all-reduce) against a uniform 3-rank run with the
   same global batch; relative loss difference after --loss-steps steps (target 1e-5).
2. efficiency on that 3-rank mix: together / (H100 group alone + A100 group alone),
   each group alone being a launch of the plan cut to that group (its share, its
   chips, the same per-chip times), rounds interleaved; median of per-round ratios.
   Target >= 95%. Done three times: chip speeds from catalog peaks (the issue's
   emulation) with the runtime's rebalancing (default) and with --no-rebalance (the
   planner's split as planned), and from the planner's per-device rates (the split the
   planner made for the chips it modelled: what remains is the runtime's loss). Each
   group alone takes the share the together run ended on.
3. gain on a 2:1 speed mix (A100 + H20): the planner's split against an even split of
   the same global batch, both --no-rebalance (else both would end on the same shares),
   --repeats triples interleaved; median gain vs the planner's predicted gain, and the
   planner's split's throughput vs the planner's prediction scaled to this host
   (report.py); the 3-rank mix's too. Target: within 10%. The third run of each triple
   is the even split with rebalancing on, against the planner's split.
4. hierarchical all-reduce bus bandwidth vs the link floor (mixed_allreduce.py: floor
   and all-reduce interleaved over rounds, median of ratios), with every link loopback
   and with the leaders' link EMULATED at --cross-link-gbs (slower than the loopback
   inside each group, as between vendor groups). Target >= 80%.
The emulation's own overhead (time past its deadlines) is reported per run.
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
from rich.progress import Progress, TaskID, TimeElapsedColumn
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "examples" / "train_mixed.py")
MIX3 = ("h100:1+a100-80g:2", "h100:1,a100-80g:2")
MIX2 = ("a100-80g:1+h20:1", "a100-80g:1,h20:1")


def argosy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "120", **(env or {})}
    cmd = [sys.executable, "-m", "argosy", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=full, check=False)


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


def one_group(plan: dict, index: int, out: Path, share: int | None = None) -> tuple[str, int]:
    """The plan cut to its group `index` (its share, its step time): that group alone.
    `share` replaces the group's share (the one a rebalanced run ended on; the planned
    step time scaled with it, same planned rate). Returns the group's --emulate-chips
    spec and device count."""
    data = json.loads(json.dumps(plan))
    entry = data["plans"][0]
    group = entry["groups"][index]
    if share is not None:
        group["step_time_s"] *= share / group["batch_share"]
        group["batch_share"] = share
    entry["groups"] = [group]
    entry["predicted"]["step_time_s"] = group["step_time_s"]
    data["global_batch"] = group["batch_share"]
    data["plans"] = [entry]
    out.write_text(json.dumps(data))
    return f"{group['chip']}:{group['devices']}", group["devices"]


def plan_times(plan: dict, reference: dict[str, float]) -> dict[str, float]:
    """Per-chip seconds per sample with speeds from the planner's per-device rates, the
    fastest chip keeping its time in `reference`."""
    groups = plan["plans"][0]["groups"]
    rates = {g["chip"]: g["batch_share"] / g["step_time_s"] / g["devices"] for g in groups}
    fastest = max(rates, key=rates.__getitem__)
    return {chip: reference[fastest] * rates[fastest] / rate for chip, rate in rates.items()}


def times_env(times: dict[str, float]) -> dict[str, str]:
    return {"ARGOSY_EMULATE_SAMPLE_S": ",".join(f"{c}={s!r}" for c, s in times.items())}


def launch(
    run_dir: Path, nproc: int, steps: int, *args: str, env: dict | None = None, script: tuple = ()
) -> dict:
    head = ["launch", "--quiet", "--run-dir", str(run_dir), "--nproc-per-node", str(nproc)]
    tail = [SCRIPT, "--steps", str(steps), "--ckpt-every", "100000", "--warmup", "2", *script]
    start = time.perf_counter()
    done = argosy(*head, *args, *tail, env=env)
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


class Bench:
    """The runs of one benchmark, in a scratch directory, with a rich progress bar."""

    def __init__(self, args: argparse.Namespace, progress: Progress, task: TaskID) -> None:
        self.args, self.progress, self.task = args, progress, task
        self.work = Path(tempfile.mkdtemp(prefix="argosy-mixed-bench-"))
        self.runs: dict[str, dict] = {}
        self.base_env = {"ARGOSY_EMULATE_HEADROOM": str(args.headroom)}

    def launch(
        self,
        name: str,
        nproc: int,
        *args: str,
        steps: int = 0,
        env: dict | None = None,
        script: tuple = (),
    ) -> dict:
        self.progress.update(self.task, description=f"run {name}")
        full = {**self.base_env, **(env or {})}
        steps = steps or self.args.steps
        summary = launch(self.work / name, nproc, steps, *args, env=full, script=script)
        self.runs[name] = summary
        self.progress.advance(self.task)
        return summary

    def plan(self, name: str, cluster: str) -> tuple[Path, dict]:
        path = self.work / f"{name}.json"
        return path, make_plan(cluster, 36, path)


def calibrated_times(summary: dict) -> dict[str, float]:
    return dict(summary["throughput"]["emulated"]["sample_s"])


def rate(summary: dict) -> float:
    return float(summary["throughput"]["measured_samples_per_s"])


def efficiency_rounds(
    bench: Bench, path: Path, plan: dict, times: dict, tag: str, rebalance: bool = True
) -> list[float]:
    """Together / (each group alone), --repeats rounds interleaved; per-round ratios.

    Each group alone takes the share the together run ended on (the planned one without
    rebalancing): the work it did together, at its best even split inside the group."""
    env = times_env(times)
    off = () if rebalance else ("--no-rebalance",)
    out = []
    for r in range(bench.args.repeats):
        key = f"{tag}.{r}"
        if key not in bench.runs:
            bench.launch(key, 3, "--plan", str(path), "--emulate-chips", MIX3[1], *off, env=env)
        used = shares_used(bench.runs[key])
        solo = 0.0
        for i in range(2):
            group_plan = bench.work / f"{tag}-group{i}.{r}.json"
            spec, devices = one_group(plan, i, group_plan, share=used[i])
            args = ("--plan", str(group_plan), "--emulate-chips", spec)
            solo += rate(bench.launch(f"{tag}-group{i}.{r}", devices, *args, env=env))
        out.append(rate(bench.runs[key]) / solo)
    return out


def shares_used(summary: dict) -> list[int]:
    """The group shares a run ended on (the plan's where it did not rebalance)."""
    return [int(g["samples_per_step"]) for g in summary["throughput"]["by_group"]]


def gain_pairs(bench: Bench, path: Path, even: Path) -> tuple[list[float], list[float]]:
    """Planned / even split on the 2:1 mix, both with rebalancing off (the planner's split
    against the even one, as planned), interleaved; the first calibrates. Then the even
    split with rebalancing on against the planned one: what the runtime recovers from a
    split it was given badly. Returns (gains, rebalanced even / planned)."""
    emulate = ("--emulate-chips", MIX2[1], "--no-rebalance")
    gains, recovered, env = [], [], None
    for r in range(bench.args.repeats):
        planned = bench.launch(f"planned2.{r}", 2, "--plan", str(path), *emulate, env=env)
        env = env or times_env(calibrated_times(planned))
        evened = bench.launch(f"even2.{r}", 2, "--plan", str(even), *emulate, env=env)
        args = ("--plan", str(even), "--emulate-chips", MIX2[1])
        rebalanced = bench.launch(f"even2-rebalanced.{r}", 2, *args, env=env)
        gains.append(rate(planned) / rate(evened))
        recovered.append(rate(rebalanced) / rate(planned))
    return gains, recovered


def run(bench: Bench) -> dict:
    path3, plan3 = bench.plan("plan3", MIX3[0])
    path2, plan2 = bench.plan("plan2", MIX2[0])
    even_split(plan2, bench.work / "plan2-even.json")
    loss_steps = bench.args.loss_steps
    args3 = ("--plan", str(path3), "--emulate-chips", MIX3[1])
    first = bench.launch("peak3.0", 3, *args3, steps=loss_steps)  # calibrates the time scale
    bench.launch("uniform3", 3, steps=loss_steps, script=("--global-batch", "36"))
    times = calibrated_times(first)
    peak = efficiency_rounds(bench, path3, plan3, times, "peak3")
    peak_off = efficiency_rounds(bench, path3, plan3, times, "peakoff3", rebalance=False)
    planned = efficiency_rounds(bench, path3, plan3, plan_times(plan3, times), "plan3")
    gains, recovered = gain_pairs(bench, path2, bench.work / "plan2-even.json")
    allreduce = emulated_link = None
    if not bench.args.skip_allreduce:
        bench.progress.update(bench.task, description="all-reduce vs link floor")
        from mixed_allreduce import measure

        rounds = bench.args.ar_rounds
        allreduce = measure([0, 1, 1], mib=bench.args.mib, repeats=5, rounds=rounds)
        link = bench.args.cross_link_gbs
        emulated_link = measure([0, 1, 1], bench.args.mib, 5, rounds, cross_link_gbs=link)
        bench.progress.advance(bench.task)
    return {
        "steps": bench.args.steps,
        "loss_steps": loss_steps,
        "headroom": bench.args.headroom,
        "runs": bench.runs,
        "efficiency_peak": peak,
        "efficiency_peak_no_rebalance": peak_off,
        "efficiency_plan": planned,
        "gains": gains,
        "even_rebalanced_vs_planned": recovered,
        "allreduce": allreduce,
        "allreduce_emulated_link": emulated_link,
        "plan2": plan2,
        "plan3": plan3,
        "times3": times,
    }


def _spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return "(" + ", ".join(fmt.format(v) for v in values) + ")"


def _vs_planner(runs: dict, prefix: str) -> list[float]:
    out = []
    for name, summary in runs.items():
        t = summary.get("throughput") or {}
        if name.startswith(prefix) and t.get("predicted_samples_per_s"):
            out.append(t["measured_samples_per_s"] / t["predicted_samples_per_s"])
    return out


def figures(result: dict) -> list[tuple[str, str, str, str, bool]]:
    """(figure, measured, target, ratio, met) rows."""
    runs, last = result["runs"], result["loss_steps"]
    mixed, uniform = runs["peak3.0"]["losses"][last], runs["uniform3"]["losses"][last]
    rel = abs(mixed - uniform) / abs(uniform)
    gains = result["gains"]
    gain, want_gain = statistics.median(gains), predicted_gain(result["plan2"])
    rows = [(f"loss, mixed vs uniform, step {last}", f"{rel:.1e} rel", "<= 1e-5", "", rel <= 1e-5)]
    labels = (
        ("efficiency_peak", "peak speeds, rebalanced"),
        ("efficiency_peak_no_rebalance", "peak speeds, --no-rebalance"),
        ("efficiency_plan", "planner speeds, rebalanced"),
    )
    for key, label in labels:
        eff = result[key]
        rows.append(
            (
                f"efficiency vs groups alone, 3-rank mix, {label}",
                f"{statistics.median(eff):.1%} {_spread(eff)}",
                ">= 95%",
                "",
                statistics.median(eff) >= 0.95,
            )
        )
    rows.append(
        (
            f"gain, planned vs even split (2:1 mix, --no-rebalance), median of {len(gains)}",
            f"{gain:.3f}x {_spread(gains)}",
            f"planner {want_gain:.3f}x",
            f"{gain / want_gain:.3f}",
            abs(gain / want_gain - 1) <= 0.10,
        )
    )
    recovered = result["even_rebalanced_vs_planned"]
    rows.append(
        (
            "even split rebalanced / planner's split (2:1 mix)",
            f"{statistics.median(recovered):.3f} {_spread(recovered)}",
            "1 +- 10%",
            f"{statistics.median(recovered):.3f}",
            abs(statistics.median(recovered) - 1) <= 0.10,
        )
    )
    vs_planner = (
        ("planned2.", "2:1 mix, planned split"),
        ("peak3.", "3-rank mix, rebalanced"),
        ("peakoff3.", "3-rank mix, --no-rebalance"),
    )
    for prefix, label in vs_planner:
        ratios = _vs_planner(runs, prefix)
        mid = statistics.median(ratios)
        rows.append(
            (
                f"throughput vs planner, {label}",
                _spread(ratios),
                "1 +- 10%",
                f"{mid:.3f}",
                abs(mid - 1) <= 0.1,
            )
        )
    for key, label in (("allreduce", "loopback"), ("allreduce_emulated_link", "emulated link")):
        ar = result.get(key)
        if ar is None:
            continue
        rows.append(
            (
                f"hierarchical busbw vs link floor ({label}), median of {ar['rounds']} rounds",
                f"{ar['hierarchical_busbw_gbps']:.2f} GB/s "
                + _spread(ar["hierarchical_vs_link_rounds"], "{:.2f}"),
                f"link {ar['link_gbps']:.2f} GB/s",
                f"{ar['hierarchical_vs_link']:.2f}",
                ar["hierarchical_vs_link"] >= 0.80,
            )
        )
    return rows


RUN_COLUMNS = (
    "run",
    "samples/s",
    "predicted",
    "in-run eff.",
    "wait ms/step",
    "lost ms/step: imbalance / sync",
    "overrun ms/step",
    "real/busy",
    "busy s/step by group",
    "shares planned -> used",
)


def _run_row(name: str, t: dict) -> list[str]:
    pred = t.get("predicted_samples_per_s")
    busy = " / ".join(f"{g['chip']} {g['busy_s_per_step']:.3f}" for g in t["by_group"])
    return [
        name,
        f"{t['measured_samples_per_s']:.2f}",
        f"{pred:.2f}" if pred else "-",
        f"{t['efficiency_vs_solo_sum']:.1%}",
        f"{t['cross_group_wait_s_per_step'] * 1e3:.1f}",
        " / ".join(f"{v * 1e3:.1f}" for v in t["lost_s_per_step"].values()),
        f"{t.get('emulation_overrun_s_per_step', 0.0) * 1e3:.2f}",
        f"{t.get('real_compute_share_of_busy', 0.0):.0%}",
        busy,
        _shares_text(t.get("shares")),
    ]


def _shares_text(shares: dict | None) -> str:
    if not shares:
        return "-"
    moved = ",".join(str(c["step"]) for c in shares["changes"])
    text = "/".join(map(str, shares["planned"])) + " -> " + "/".join(map(str, shares["used"]))
    return text + (f" (step {moved})" if moved else "")


def show(result: dict, console: Console) -> None:
    title = f"mixed-chip training, CPU, EMULATED chips (headroom {result['headroom']})"
    table = Table(title=title)
    for column in ("figure", "measured", "target / peer", "ratio", "met"):
        table.add_column(column)
    for name, measured, target, ratio, met in figures(result):
        table.add_row(name, measured, target, ratio, "yes" if met else "NO")
    console.print(table)
    detail = Table(title="runs")
    for column in RUN_COLUMNS:
        detail.add_column(column)
    for name, summary in result["runs"].items():
        t = summary.get("throughput") or {}
        if "by_group" in t:
            detail.add_row(*_run_row(name, t))
    console.print(detail)
    note = result["runs"]["peak3.0"]["throughput"]["emulated"]["note"]
    console.print(f"emulation: {note}", highlight=False, markup=False)
    times = ", ".join(f"{c} {s * 1e3:.1f} ms" for c, s in result["times3"].items())
    console.print(f"3-rank mix, calibrated seconds per sample: {times}", highlight=False)
    for key in ("allreduce", "allreduce_emulated_link"):
        ar = result.get(key)
        if ar is None:
            continue
        link = ar.get("cross_link_gbs")
        where = f"leaders' link EMULATED at {link} GB/s" if link else "every link loopback TCP"
        console.print(
            f"all-reduce {ar['mib']:.0f} MiB over groups {ar['groups']} (gloo, {where}): "
            f"link floor (one-way send/recv between the group leaders) "
            f"{ar['link_s'] * 1e3:.1f} ms, flat {ar['flat_s'] * 1e3:.1f} ms, hierarchical "
            f"{ar['hierarchical_s'] * 1e3:.1f} ms ({ar['hierarchical_vs_flat']:.2f}x flat)",
            highlight=False,
        )
    load = result["load_average"]
    console.print(
        f"host: {os.cpu_count()} cores, load average {load[0]:.1f} at the end, "
        f"{result['load_start'][0]:.1f} at the start (shared machine)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=14, help="steps per throughput run")
    p.add_argument("--loss-steps", type=int, default=30, help="steps of the exactness pair")
    p.add_argument("--mib", type=float, default=16.0, help="all-reduce tensor size")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds / pairs")
    p.add_argument("--ar-rounds", type=int, default=7, help="all-reduce rounds")
    p.add_argument("--headroom", type=float, default=3.0, help="calibration headroom (>= 1)")
    p.add_argument(
        "--cross-link-gbs", type=float, default=0.25, help="emulated leaders' link, GB/s"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument(
        "--skip-allreduce", action="store_true", help="leave out the all-reduce figures (4.)"
    )
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    load_start = os.getloadavg()
    total = 2 + 3 * args.repeats * 3 - 1 + 3 * args.repeats + (0 if args.skip_allreduce else 1)
    with Progress(*Progress.get_default_columns(), TimeElapsedColumn()) as progress:
        task = progress.add_task("mixed-chip benchmark", total=total)
        result = run(Bench(args, progress, task))
    result["load_average"] = os.getloadavg()
    result["load_start"] = load_start
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    show(result, Console(width=200))


if __name__ == "__main__":
    main()
