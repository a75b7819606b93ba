"""Benchmark of the scheduler and simulator (issues 6, 11): speed, cycle latency, quality.

    .venv/bin/python benchmarks/sim.py quality --cluster a100-80g:4000+h100:4000+910b:2000
    .venv/bin/python benchmarks/sim.py quality --cluster h100:10000 --days 30
    .venv/bin/python benchmarks/sim.py quality --cluster h100:10000 --plans stock
    .venv/bin/python benchmarks/sim.py speed --cluster h100:100000 --policies argosy
    .venv/bin/python benchmarks/sim.py speed --cluster h100:10000 --trace DIR   # a stored trace
    .venv/bin/python benchmarks/sim.py cycle --devices 10000 --pending 5000
    .venv/bin/python benchmarks/sim.py calibration --devices 10000 --days 30
    .venv/bin/python benchmarks/sim.py isolation --cluster h100:10000 --days 30
    .venv/bin/python benchmarks/sim.py offered --cluster a100-80g:4000+h100:4000+910b:2000
    .venv/bin/python benchmarks/sim.py left --cluster h100:10000 --policies argosy,quota

`quality` runs fifo, quota and argosy side by side on the same trace and seed (30 days,
the published fault model), prints a table with argosy's ratios to each, and checks the
issue-11 targets (allocation >= 92%, effective training time >= 99%, SLO >= 99%, product
>= 1.3x quota and 1.5x fifo with planner plans or 1.1x quota with --plans stock, training
p99 wait no worse than quota's, < 60 s per policy); `speed` times each policy; `cycle`
times scheduling cycles with N pending workloads on a full cluster; `isolation` runs
argosy with node isolation off, by the scheduler's fault count and by the health layer's
node-record policy (effective training time with and without isolating lemon nodes);
`left` lists the training work each policy leaves undone at the horizon (what stands
between its product and the trace's ceiling), by state, kind and accepted chips.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from argosy.core.clock import FakeClock
from argosy.hardware.loader import load_cluster
from argosy.scheduler.config import SchedulerConfig
from argosy.scheduler.core import Scheduler
from argosy.scheduler.policies import policies
from argosy.scheduler.queues import QueuesFile, build_tree
from argosy.scheduler.workload import Workload
from argosy.sim.config import SimConfig
from argosy.sim.engine import Simulation
from argosy.sim.generate import generate
from argosy.sim.isolation import HealthPolicyIsolation, NoIsolation


def _trace(spec: str, days: float, seed: int, stored: str | None = None, load: float = 1.0):
    """The cluster, a generated trace (or the one `argosy sim generate` wrote to the
    directory `stored`: a fixed trace that later generator changes do not move), and
    the seconds it took."""
    cluster = load_cluster(spec)
    t0 = time.perf_counter()
    if stored:
        import yaml

        from argosy.sim.trace import read_trace

        queues = yaml.safe_load((Path(stored) / "queues.yaml").read_text())
        gen = SimpleNamespace(records=read_trace(Path(stored) / "trace.jsonl").records,
                              queues=queues)  # fmt: skip
    else:
        gen = generate(cluster, days, seed=seed, load=load)
    return cluster, gen, time.perf_counter() - t0


def _run(cluster, gen, policy: str, seed: int, heads: int | None = None,
         plans: str = "planner", isolation: str = "health") -> dict:  # fmt: skip
    """One policy on the trace; `isolation`: health (the health layer's node-record
    policy, as `argosy sim run`), scheduler (its own fault count) or off."""
    return _simulation(cluster, gen, policy, seed, heads, plans, isolation).run()


def _simulation(cluster, gen, policy: str, seed: int, heads: int | None = None,
                plans: str = "planner", isolation: str = "health") -> Simulation:  # fmt: skip
    """The simulation `_run` runs (its jobs stay readable after `run()`)."""
    tree = build_tree(QueuesFile.model_validate(gen.queues), cluster)
    chosen = policies.get(policy)
    if heads is not None:  # e.g. quota without Kueue's one admission per queue per cycle
        chosen = replace(chosen, heads_per_queue=heads)
    sim = SimConfig(plans=plans)
    config = SchedulerConfig()
    isolate = {"health": lambda: HealthPolicyIsolation(config), "off": NoIsolation,
               "scheduler": lambda: None}[isolation]()  # fmt: skip
    return Simulation(cluster, tree, gen.records, chosen, seed=seed, sim=sim, config=config,
                      isolation=isolate)  # fmt: skip


def left_part(args) -> dict:
    """Per policy: the work not done at the horizon, in product points (the trace's
    ceiling minus the policy's product), by state (running, never started, waiting after
    a start), kind and accepted chips, largest first; with how long before the end those
    jobs were submitted."""
    from sim_left import left_at_horizon

    cluster, gen, _ = _trace(args.cluster, args.days, args.seed)
    out = {}
    for policy in args.policies.split(","):
        simulation = _simulation(cluster, gen, policy, args.seed, plans=args.plans)
        product = simulation.run()["five_factor"]["product"]["value"]
        rows = left_at_horizon(simulation)
        total = sum(r["product_points"] for r in rows)
        print(f"\n{policy}: product {product:.4f}; left undone {total:.4f} (product + "
              f"left {product + total:.4f})")  # fmt: skip
        print("| product points | jobs | state | kind | chips | submitted, days before the end |")
        print("|---|---|---|---|---|---|")
        for r in rows[:8]:
            print(f"| {r['product_points']:.4f} | {r['jobs']} | {r['state']} | {r['kind']} | "
                  f"{r['chips']} | {r['days_before_end']} |")  # fmt: skip
        out[policy] = {"product": product, "left": rows}
    return out


def isolation_part(args) -> dict:
    """argosy on one trace with node isolation off, by the scheduler's own hardware-fault
    count, and by the health layer's node-record policy: what isolating lemons buys."""
    cluster, gen, _ = _trace(args.cluster, args.days, args.seed)
    out = {}
    print("| isolation | effective training time | allocation | product | faults | "
          "quarantined nodes | sim CPU s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for how in args.isolations.split(","):
        start = time.process_time()
        r = _run(cluster, gen, "argosy", args.seed, isolation=how)
        cpu = time.process_time() - start
        out[how] = r
        print(f"| {how} | {100 * r['effective_training_time']:.2f}% | "
              f"{100 * r['allocation_rate']:.1f}% | {r['five_factor']['product']['value']:.4f} | "
              f"{r['faults']} | {r['quarantined_nodes']} | {cpu:.1f} |", flush=True)  # fmt: skip
    return out


def speed(args) -> dict:
    cluster, gen, gen_s = _trace(args.cluster, args.days, args.seed, args.trace)
    out = {"cluster": args.cluster, "days": args.days, "workloads": len(gen.records),
           "generate_s": round(gen_s, 1)}  # fmt: skip
    for policy in args.policies.split(","):
        cpu = time.process_time()
        report = _run(cluster, gen, policy, args.seed)
        out[policy] = {"sim_wall_s": round(report["sim_wall_s"], 1),
                       "sim_cpu_s": round(time.process_time() - cpu, 1),
                       "max_rss_gib": round(_max_rss_gib(), 2),
                       "cycles": report["cycles"], "faults": report["faults"],
                       "allocation_rate": round(report["allocation_rate"], 4)}  # fmt: skip
        print(json.dumps({policy: out[policy]}), flush=True)
    return out


def _max_rss_gib() -> float:
    """Peak resident memory of this process so far (the trace, the scheduler, the jobs)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def cycle(args) -> dict:
    """A full cluster (fixed 8-64 device gangs) with `pending` workloads waiting; each
    round one running job completes and a cycle runs. Median and p99 over rounds."""
    rng = np.random.default_rng(args.seed)
    cluster = load_cluster(f"h100:{args.devices}")
    spec = {"queues": [{"name": "org", "children": [
        {"name": q, "quota": {"h100": {"nominal": args.devices // 4}}}
        for q in ("train", "finetune", "eval", "debug")]}]}  # fmt: skip
    out = {}
    for name in ("quota", "argosy"):
        clock = FakeClock()
        sched = Scheduler(cluster, build_tree(QueuesFile.model_validate(spec), cluster),
                          policies.get(name), clock=clock)  # fmt: skip
        queues = ["train", "finetune", "eval", "debug"]
        for i in range(args.devices // 16 + args.pending):
            n = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
            sched.submit(Workload(f"w{i}", "eval", queues[i % 4], int(rng.integers(0, 4)),
                                  ("h100",), n, n, float(i)))  # fmt: skip
        for _ in range(200):  # admit until the cluster is full
            if not sched.cycle():
                break
        for j in range(args.pending - len(sched.pending)):  # top up to `pending` waiting
            n = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
            sched.submit(Workload(f"x{j}", "eval", queues[j % 4], int(rng.integers(0, 4)),
                                  ("h100",), n, n, 1e6 + j))  # fmt: skip
        times = []
        for _ in range(args.rounds):
            clock.advance(10.0)
            running = list(sched.running.values())
            sched.complete(running[int(rng.integers(len(running)))])
            t0 = time.perf_counter()
            sched.cycle()
            times.append(time.perf_counter() - t0)
        out[name] = {"pending": len(sched.pending), "running": len(sched.running),
                     "p50_ms": round(statistics.median(times) * 1e3, 2),
                     "p99_ms": round(float(np.percentile(times, 99)) * 1e3, 2)}  # fmt: skip
    print(json.dumps(out))
    return out


ROWS = [
    ("allocation_rate", lambda r: r["allocation_rate"]),
    ("useful_rate", lambda r: r["useful_rate"]),
    ("effective_training_time", lambda r: r["effective_training_time"]),
    ("slo_attainment", lambda r: r["slo_attainment"]),
    ("x utilization (factor)", lambda r: r["five_factor"]["resource_utilization"]["value"]),
    ("x productive/allocated", lambda r: r["five_factor"]["effective_training_time"]["value"]),
    ("x single-chip (MFU)", lambda r: r["five_factor"]["single_chip_efficiency"]["value"]),
    ("x parallel scaling", lambda r: r["five_factor"]["parallel_scaling"]["value"]),
    ("five-factor product", lambda r: r["five_factor"]["product"]["value"]),
    ("train queue p99 s", lambda r: r["queue_s"].get("train", {}).get("p99", 0.0)),
    ("finetune queue p99 s", lambda r: r["queue_s"].get("finetune", {}).get("p99", 0.0)),
    ("eval queue p90 s", lambda r: r["queue_s"].get("eval", {}).get("p90", 0.0)),
    ("unstarted at end", lambda r: sum(r["unstarted"].values())),
    ("rejected at submit", lambda r: r["rejected"]),
    ("preemptions", lambda r: r["preemptions"]),
    ("resizes", lambda r: r["resizes"]),
    ("lost device-h", lambda r: r["lost_device_hours"]),
    ("stalled device-h", lambda r: r["stalled_device_hours"]),
    ("sim wall s", lambda r: r["sim_wall_s"]),
    ("sim CPU s", lambda r: r["sim_cpu_s"]),
]


def quality(args) -> dict:
    cluster, gen, _ = _trace(args.cluster, args.days, args.seed)
    print(f"{args.cluster}, {args.days:g} days, plans {args.plans}: offered load "
          f"{gen.offered_load:.3f}, {len(gen.records)} workloads", flush=True)  # fmt: skip
    if args.pools:  # keep each day's split too
        import argosy.sim.engine as engine

        engine.IdleBreakdown = _DailyIdle
    reports = {}
    chosen = args.policies.split(",")
    for p in chosen:
        start = time.process_time()
        heads = args.quota_heads if p == "quota" else None
        reports[p] = _run(cluster, gen, p, args.seed, heads, args.plans)
        reports[p]["sim_cpu_s"] = time.process_time() - start
    if set(chosen) != {"fifo", "quota", "argosy"}:  # iterating on one policy: no ratios
        print("| metric | " + " | ".join(chosen) + " |")
        print("|---|" + "---|" * len(chosen))
        for name, get in ROWS:
            print(f"| {name} | " + " | ".join(f"{get(reports[p]):.4g}" for p in chosen) + " |")
        _why(reports)
        if args.pools:
            _why_pools(reports)
        return reports
    print("| metric | fifo | quota | argosy | argosy / quota | argosy / fifo |")
    print("|---|---|---|---|---|---|")
    for name, get in ROWS:
        f, q, a = (get(reports[p]) for p in ("fifo", "quota", "argosy"))
        print(f"| {name} | {f:.4g} | {q:.4g} | {a:.4g} | {_ratio(a, q)} | {_ratio(a, f)} |")
    _why(reports)
    if args.pools:
        _why_pools(reports)
    _bound(reports, _ceiling(cluster, gen, args.days))
    _targets(reports, args.plans)
    return reports


def _bound(reports: dict, ceiling: dict[str, float]) -> None:
    """What the trace allows: each policy's product against the ceiling (every offered
    job done), and the largest lead any policy could have over fifo and quota."""
    prod = {p: r["five_factor"]["product"]["value"] for p, r in reports.items()}
    top = ceiling["product"]
    print(f"\ntrace ceiling (all offered work done, every service's load served): "
          f"product {top:.4f} (training {ceiling['train']:.4f} + inference "
          f"{ceiling['infer']:.4f})")  # fmt: skip
    for p, v in prod.items():
        print(f"{p}: {v:.4f} = {100 * v / top:.1f}% of the ceiling; the ceiling is "
              f"{top / v:.3f}x {p}'s product")  # fmt: skip


def _ceiling(cluster, gen, days: float) -> dict[str, float]:
    """The most any policy's product can be on this trace: every job's work done (a job's
    progress is in device-seconds of the reference chip on the stock plan at its nominal
    size, and the ledger credits a unit of progress with exactly that reference's FLOPs,
    whatever the chip, plan or size it ran on: `argosy.sim.ledger`) plus every service's
    needed replicas served at `sim.serving_mfu`, over the owned peak FLOPs."""
    from argosy.hardware.catalog import default_catalog
    from argosy.scheduler.speed import REFERENCE_CHIP
    from argosy.sim.plans import PlanCosts, job_model

    horizon, cfg, costs = days * 86400.0, SimConfig(), PlanCosts()
    peak = {g.chip.id: g.chip.peak_tflops("bf16") * 1e12 for g in cluster.groups}
    owned = sum(g.num_devices * peak[g.chip.id] for g in cluster.groups) * horizon
    ref_peak = default_catalog().get(REFERENCE_CHIP).peak_tflops("bf16") * 1e12
    train = infer = 0.0
    for r in gen.records:
        if r.kind == "infer":
            load = np.asarray(r.load_profile if r.load_profile else [1.0])
            steps = int(horizon // r.profile_step_s)
            needed = np.ceil(r.devices * load[np.arange(steps) % len(load)] - 1e-9)
            chip = default_catalog().get(r.chips[0]).id
            infer += float(needed.sum()) * r.profile_step_s * peak[chip] * cfg.serving_mfu
            continue
        size = r.device_range[1]
        mfu, scaling = costs.efficiency(job_model(r.kind, size), REFERENCE_CHIP, size, stock=True)
        train += r.work_device_s * ref_peak * mfu * scaling
    return {"product": (train + infer) / owned, "train": train / owned, "infer": infer / owned}


def _why(reports: dict) -> None:
    """Where each policy's owned device-time went (argosy.sim.idle), whole cluster."""
    from argosy.sim.idle import CATEGORIES

    print("\n| owned device-time | " + " | ".join(reports) + " |")
    print("|---|" + "---|" * len(reports))
    for k in CATEGORIES:
        cells = " | ".join(f"{100 * reports[p]['idle']['all'][k]:.1f}%" for p in reports)
        print(f"| {k} | {cells} |")


class _DailyIdle:
    """Wraps the simulator's `IdleBreakdown` to also keep each day's split per pool
    (`--pools`): which pool idles, and when in the month."""

    def __init__(self, sched) -> None:
        from argosy.sim.idle import IdleBreakdown

        self.inner = IdleBreakdown(sched)
        self.t = 0.0
        self.days: list[dict[str, dict[str, float]]] = []

    def sample(self, sched, step_s: float) -> None:
        from argosy.sim.idle import CATEGORIES

        before = {c: dict(row) for c, row in self.inner.seconds.items()}
        self.inner.sample(sched, step_s)
        day = int(self.t // 86400)
        while len(self.days) <= day:
            self.days.append({c: dict.fromkeys(CATEGORIES, 0.0) for c in self.inner.chips})
        for c, row in self.inner.seconds.items():
            for k, v in row.items():
                self.days[day][c][k] += v - before[c][k]
        self.t += step_s

    @property
    def seconds(self) -> dict:
        return self.inner.seconds

    def report(self) -> dict:
        out = self.inner.report()
        out["_days"] = self.days
        return out


def _why_pools(reports: dict) -> None:
    """The same split per chip pool, one column per (policy, pool), then argosy's idle
    categories per pool by day."""
    from argosy.sim.idle import CATEGORIES

    cols = [(p, c) for p in reports for c in reports[p]["idle"] if c[0] != "_" and c != "all"]
    print("\n| owned device-time | " + " | ".join(f"{p} {c}" for p, c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for k in CATEGORIES:
        cells = " | ".join(f"{100 * reports[p]['idle'][c][k]:.1f}%" for p, c in cols)
        print(f"| {k} | {cells} |")
    days = reports.get("argosy", {}).get("idle", {}).get("_days")
    if not days:
        return
    pools = list(days[0])
    print("\nargosy, per day and pool: allocated / blocked / growth held / no work (%)")
    for i, day in enumerate(days):
        cells = []
        for c in pools:
            row, owned = day[c], sum(day[c].values()) or 1.0
            blocked = row["blocked_frag"] + row["blocked_whole"]
            cells.append(f"{c} {100 * row['allocated'] / owned:.0f}/{100 * blocked / owned:.1f}/"
                         f"{100 * row['growth_held'] / owned:.1f}/"
                         f"{100 * row['no_work'] / owned:.1f}")  # fmt: skip
        print(f"day {i:2d}: " + "  ".join(cells))


def _targets(reports: dict, plans: str) -> None:
    a, q = reports["argosy"], reports["quota"]
    prod = {p: r["five_factor"]["product"]["value"] for p, r in reports.items()}
    train_wait = max(a["queue_s"].get(k, {}).get("p99", 0.0) for k in ("train", "finetune"))
    quota_wait = max(q["queue_s"].get(k, {}).get("p99", 0.0) for k in ("train", "finetune"))
    checks = [
        ("argosy allocation >= 92%", a["allocation_rate"] >= 0.92),
        ("argosy effective training time >= 99%", a["effective_training_time"] >= 0.99),
        ("argosy SLO >= 99%", a["slo_attainment"] >= 0.99),
        ("training p99 wait <= quota's", train_wait <= quota_wait),
        ("every policy < 60 s CPU", all(r["sim_cpu_s"] < 60 for r in reports.values())),
    ]
    if plans == "stock":
        checks.append(
            ("product >= 1.1x quota (stock plans)", prod["argosy"] >= 1.1 * prod["quota"])
        )
    else:
        checks.append(("product >= 1.3x quota", prod["argosy"] >= 1.3 * prod["quota"]))
        checks.append(("product >= 1.5x fifo", prod["argosy"] >= 1.5 * prod["fifo"]))
    for name, ok in checks:
        print(f"target {'met' if ok else 'MISSED'}: {name}")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3g}x" if b else "-"


def offered(args) -> None:
    """Devices each set of accepted chip types asks for, per day: every job at its nominal
    size from its submission for as long as its work takes at the stock plan's speed on
    its fastest accepted chip (the trace's unit), averaged over the day. Which pool the
    trace leaves idle, whatever the scheduler does."""
    from argosy.hardware.catalog import default_catalog
    from argosy.scheduler.speed import relative_speed

    cluster, gen, _ = _trace(args.cluster, args.days, args.seed)
    catalog, hours = default_catalog(), int(args.days * 24)
    have = cluster.devices_by_chip()
    demand: dict[tuple[str, ...], np.ndarray] = {}
    for r in gen.records:
        if r.kind == "infer":
            continue
        chips = tuple(sorted(catalog.get(c).id for c in r.chips))
        size = r.device_range[1]
        hold = r.work_device_s / size / max(relative_speed(c) for c in chips)
        a, b = int(r.submit_s // 3600), int(min(hours * 3600 - 1, r.submit_s + hold) // 3600)
        demand.setdefault(chips, np.zeros(hours))[a : b + 1] += size
    for chips, per_hour in sorted(demand.items()):
        daily = per_hour[: hours // 24 * 24].reshape(-1, 24).mean(axis=1)
        print(f"{'+'.join(chips)} ({sum(have[c] for c in chips)} devices): "
              + " ".join(f"{x:.0f}" for x in daily))  # fmt: skip
    print("per pool, % of its devices (a set's demand split over its chips by capacity):")
    for chip, per_hour in _pool_demand(demand, have).items():
        daily = per_hour[: hours // 24 * 24].reshape(-1, 24).mean(axis=1)
        print(f"{chip} ({have[chip]}): " + " ".join(f"{x:.0f}" for x in 100 * daily / have[chip]))


def _pool_demand(demand: dict, have: dict) -> dict[str, np.ndarray]:
    """Devices each chip pool is asked for: a set's work (devices at its fastest chip's
    speed) shared over its chips by capacity (devices x speed), in that chip's devices."""
    from argosy.scheduler.speed import relative_speed

    hours = len(next(iter(demand.values()), ()))
    out = {c: np.zeros(hours) for c in have}
    for chips, per_hour in demand.items():
        fastest = max(relative_speed(c) for c in chips)
        cap = {c: have[c] * relative_speed(c) for c in chips}
        for c in chips:
            out[c] += per_hour * fastest * cap[c] / sum(cap.values()) / relative_speed(c)
    return out


def calibration(args) -> None:
    """Generated statistics next to the source statistics they are calibrated to."""
    from argosy.sim import calibration as cal

    _, gen, _ = _trace(f"h100:{args.devices}", args.days, args.seed)
    jobs = [r for r in gen.records if r.kind != "infer"]
    kinds = np.array([r.kind for r in jobs])
    size = np.array([r.device_range[1] for r in jobs])
    dur = np.array([r.work_device_s / r.device_range[1] for r in jobs])
    work = np.array([r.work_device_s for r in jobs])
    per_day = len(jobs) / args.devices / args.days
    print(f"workloads {len(gen.records)}; per device-day {per_day:.3f}; "
          f"offered {gen.offered_load:.3f}")  # fmt: skip
    print("| kind | count % (gen) | count % (Seren) | device-time % (gen) | p25/p50/p75/p90 s (gen)"
          " | p25/p50/p75/p90 s (Acme Seren) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for k in ("eval", "finetune", "debug", "train"):
        m = kinds == k
        qs = np.quantile(dur[m], [0.25, 0.5, 0.75, 0.9]).round().astype(int).tolist()
        src = [cal.DURATION_QUANTILES[k][p] for p in (0.25, 0.5, 0.75, 0.9)]
        print(f"| {k} | {100 * m.mean():.1f} | {100 * cal.KIND_SHARE[k]:.1f} | "
              f"{100 * work[m].sum() / work.sum():.1f} | {qs} | {src} |")  # fmt: skip
    bins = [(1, 1), (2, 2), (3, 8), (9, 64), (65, 256), (257, 1 << 30)]
    print("| GPUs | jobs % (gen) | jobs % (Seren) | GPU-time % (gen) | GPU-time % (Seren) |")
    print("|---|---|---|---|---|")
    seren_jobs = [54.0, 11.4, 31.3, 2.6, 0.4, 0.3]
    seren_time = [1.3, 0.5, 10.1, 15.7, 28.7, 43.7]
    for (lo, hi), sj, st in zip(bins, seren_jobs, seren_time, strict=True):
        m = (size >= lo) & (size <= hi)
        label = f"{lo}-{hi}" if hi < 1 << 30 else f">{lo - 1}"
        print(f"| {label} | {100 * m.mean():.1f} | {sj} | {100 * work[m].sum() / work.sum():.1f}"
              f" | {st} |")  # fmt: skip
    submit = np.array([r.submit_s for r in jobs if r.submit_s > 0])
    hourly = np.bincount(((submit % 86400) // 3600).astype(int), minlength=24)
    print(f"hourly peak/trough {hourly.max() / max(hourly.min(), 1):.1f} (Venus 9.3)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["speed", "cycle", "quality", "calibration", "isolation",
                                         "offered", "left"])  # fmt: skip
    parser.add_argument("--devices", type=int, default=10000)
    parser.add_argument("--cluster", default="a100-80g:4000+h100:4000+910b:2000")
    parser.add_argument("--plans", choices=["planner", "stock"], default="planner")
    parser.add_argument("--policies", default="fifo,quota,argosy")
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--pending", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", default=None,
                        help="speed part: a directory of `argosy sim generate` (trace.jsonl, "
                             "queues.yaml) to replay instead of generating one")  # fmt: skip
    parser.add_argument("--isolations", default="off,scheduler,health",
                        help="isolation part: which of off, scheduler, health to run")  # fmt: skip
    parser.add_argument("--pools", action="store_true",
                        help="quality part: the device-time split per chip pool too")  # fmt: skip
    parser.add_argument(
        "--quota-heads", type=int, default=None, help="quota's admissions per queue per cycle"
    )
    args = parser.parse_args()
    parts = {"speed": speed, "cycle": cycle, "quality": quality, "calibration": calibration,
             "isolation": isolation_part, "offered": offered, "left": left_part}  # fmt: skip
    parts[args.part](args)


if __name__ == "__main__":
    main()
