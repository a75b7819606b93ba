"""`argosy sim generate`: a synthetic LLM-cluster trace calibrated to public traces.

    gen = generate(cluster, days=30, seed=0)         # GeneratedTrace
    gen.offered_load                                 # ~1.0 x what the cluster can do
    write_generated(gen, Path("runs/t"))             # trace.jsonl + queues.yaml

The mix: arrivals follow the Helios hour-of-day and weekday profile in bursts; job
kinds, sizes and run times follow Acme (Seren) per job type; pretraining jobs are
elastic, and the tail of their run times is solved for so the trace offers `load` times
the work the cluster can do (inference included); inference services have DLRM-like
replica counts and a diurnal load. Load is balanced per pool: services by each pool's
devices, and each batch job's accepted chips (one vendor's chip types, or one chip type
for a third of jobs) chosen in submit order for the pool offered the least work against
its capacity over the job's run (`balanced_chips`), so every pool is offered about its
capacity share in every day of the trace. Constants and sources: `argosy.sim.calibration`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from argosy.hardware.cluster import Cluster
from argosy.scheduler.speed import relative_speed
from argosy.sim import calibration as cal
from argosy.sim.trace import TraceRecord, write_trace

DAY_S = 86400.0


@dataclass
class GeneratedTrace:
    records: list[TraceRecord]
    queues: dict
    offered_load: float
    capacity_device_s: float


def generate(cluster: Cluster, days: float, seed: int = 0, load: float = 1.0) -> GeneratedTrace:
    """A calibrated trace for `cluster` over `days` offering `load` x its capacity."""
    rng = np.random.default_rng(seed)
    horizon = days * DAY_S
    speeds = {c: relative_speed(c) for c in cluster.devices_by_chip()}
    capacity = sum(n * speeds[c] for c, n in cluster.devices_by_chip().items()) * horizon
    services, infer_work = _services(cluster, rng, horizon, speeds)
    jobs = _batch_jobs(cluster, rng, horizon, speeds, load * capacity - infer_work)
    records = sorted(services + jobs, key=lambda r: r.submit_s)
    offered = (infer_work + sum(r.work_device_s for r in jobs)) / capacity
    return GeneratedTrace(records, _queues(cluster, services), offered, capacity)


def write_generated(gen: GeneratedTrace, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    trace, queues = out_dir / "trace.jsonl", out_dir / "queues.yaml"
    write_trace(gen.records, trace)
    tmp = queues.with_name("queues.yaml.tmp")
    tmp.write_text(yaml.safe_dump(gen.queues, sort_keys=False))
    os.replace(tmp, queues)
    return trace, queues


# ---- inference services ---------------------------------------------------------------
def diurnal_profile(peak_hour: float, steps: int = 144) -> list[float]:
    """One day of load as a fraction of the peak: trough `INFER_TROUGH`, a raised-cosine
    peak sharpened until the day's mean over its peak is `INFER_MEAN_TO_PEAK`."""
    hours = np.arange(steps) * 24.0 / steps
    base = (1 + np.cos(2 * np.pi * (hours - peak_hour) / 24.0)) / 2
    trough = cal.INFER_TROUGH
    want = (cal.INFER_MEAN_TO_PEAK - trough) / (1 - trough)
    lo, hi = 0.1, 50.0
    for _ in range(60):  # mean of base**p falls as p grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(np.mean(base**mid)) > want else (lo, mid)
    return [round(float(x), 4) for x in trough + (1 - trough) * base**hi]


def _services(cluster: Cluster, rng, horizon: float, speeds) -> tuple[list[TraceRecord], float]:
    """Services per chip pool in proportion to its devices (at least one each), their
    peaks summing to `INFER_PEAK_SHARE` of every pool: no pool serves more than its
    share, so batch work sees the same room everywhere."""
    by_chip = cluster.devices_by_chip()
    total = cluster.num_devices
    count = max(len(by_chip), round(total / 1000 * cal.INFER_SERVICES_PER_1K_DEVICES))
    counts = _apportion(count, np.array(list(by_chip.values()), dtype=float))
    sigma = math.log(cal.INFER_REPLICA_P90 / cal.INFER_REPLICA_MEDIAN) / 1.2816
    records, work = [], 0.0
    for (chip, devices), k in zip(by_chip.items(), counts, strict=True):
        raw = rng.lognormal(math.log(cal.INFER_REPLICA_MEDIAN), sigma, size=int(k))
        peaks = np.maximum(1, np.floor(raw / raw.sum() * cal.INFER_PEAK_SHARE * devices))
        for peak in peaks.astype(int):
            profile = diurnal_profile(cal.INFER_PEAK_HOUR + float(rng.uniform(-2, 2)))
            work += peak * float(np.mean(profile)) * horizon * speeds[chip]
            records.append(
                TraceRecord(
                    id=f"svc{len(records):03d}", submit_s=0.0, kind="infer", queue="infer",
                    priority=cal.PRIORITY["infer"], chips=[chip], devices=int(peak),
                    load_profile=profile, profile_step_s=DAY_S / len(profile), slo_target=0.99,
                )
            )  # fmt: skip
    return records, work


def _apportion(n: int, weights: np.ndarray) -> np.ndarray:
    """`n` split by `weights` (largest remainders), at least one each."""
    share = weights / weights.sum() * max(n - len(weights), 0)
    out = np.floor(share).astype(int)
    out[np.argsort(out - share)[: max(n - len(weights), 0) - int(out.sum())]] += 1
    return out + 1


# ---- batch jobs -----------------------------------------------------------------------
def _arrivals(rng, days: float, n_expected: float) -> np.ndarray:
    """(time, batch id) of every job: batches arrive as a Poisson process following the
    Venus hour-of-day and weekday profile; batch sizes follow `burst_law`."""
    hours = int(math.ceil(days * 24))
    h = np.arange(hours)
    weekend = ((h // 24) % 7) >= 5
    weight = np.array(cal.HOURLY_PROFILE)[h % 24] / np.where(weekend, cal.WEEKDAY_TO_WEEKEND, 1)
    per_hour = n_expected * weight / weight.sum()
    law = burst_law(float(n_expected / max(days * 144, 1e-9)), weight)
    mean_batch = float((law * np.arange(1, len(law) + 1)).sum())
    batches = rng.poisson(per_hour / mean_batch)
    starts = np.repeat(h * 3600.0, batches) + rng.uniform(0, 3600, size=batches.sum())
    sizes = rng.choice(np.arange(1, len(law) + 1), size=len(starts), p=law)
    times = np.repeat(starts, sizes) + rng.uniform(0, 60, size=sizes.sum())
    batch_of = np.repeat(np.arange(len(starts)), sizes)
    keep = times < days * DAY_S
    return np.column_stack([times[keep], batch_of[keep]])


def burst_law(jobs_per_10min: float, hourly_weight: np.ndarray) -> np.ndarray:
    """P(batch size = 1..MAX_BATCH), a power law whose exponent makes the per-10-min job
    count's coefficient of variation `ARRIVAL_CV_10MIN`. A compound Poisson count with
    batch size S over a rate that varies as the profile has CV^2 = CV_profile^2 +
    E[S^2] / (E[S] x jobs per bin), so E[S^2]/E[S] is solved for by bisection."""
    cv_profile2 = float(np.var(hourly_weight) / np.mean(hourly_weight) ** 2)
    target = max(1.0, (cal.ARRIVAL_CV_10MIN**2 - cv_profile2) * jobs_per_10min)
    s = np.arange(1, cal.MAX_BATCH + 1, dtype=float)

    def law(a: float) -> np.ndarray:
        p = s**-a
        return p / p.sum()

    lo, hi = 0.0, 8.0  # E[S^2]/E[S] falls as the exponent grows
    for _ in range(60):
        mid = (lo + hi) / 2
        p = law(mid)
        lo, hi = (mid, hi) if (p * s * s).sum() / (p * s).sum() > target else (lo, mid)
    return law(hi)


def sample_quantiles(rng, table: dict[float, float], u: np.ndarray) -> np.ndarray:
    """Inverse-sample a quantile table with log-linear interpolation."""
    ps = np.array(list(table))
    logs = np.log(np.array(list(table.values())))
    return np.exp(np.interp(u, ps, logs))


def _batch_jobs(cluster, rng, horizon, speeds, target_work) -> list[TraceRecord]:
    days = horizon / DAY_S
    arr = _arrivals(rng, days, cal.JOBS_PER_DEVICE_DAY * cluster.num_devices * days)
    n_batches = int(arr[:, 1].max()) + 1 if len(arr) else 0
    kinds_list = list(cal.KIND_SHARE)
    shares = np.array(list(cal.KIND_SHARE.values()))
    kind_of_batch = rng.choice(len(kinds_list), size=n_batches, p=shares / shares.sum())
    batch = arr[:, 1].astype(int)
    kinds = np.array(kinds_list)[kind_of_batch[batch]]
    size_of_batch = _sizes(cluster, rng, np.array(kinds_list)[kind_of_batch])
    sizes = size_of_batch[batch]
    u = rng.uniform(0, 1, size=len(arr))
    arr, kinds, sizes, u = _standing_runs(cluster, rng, arr, kinds, sizes, u)
    durations = np.zeros(len(arr))
    for kind in ("eval", "finetune", "debug"):
        mask = kinds == kind
        durations[mask] = sample_quantiles(rng, cal.DURATION_QUANTILES[kind], u[mask])
    pinned = rng.uniform(size=len(arr)) < cal.PINNED_CHIP_SHARE
    window = horizon - arr[:, 0]
    durations = np.minimum(durations, window)
    by_chip = cluster.devices_by_chip()
    mean = np.full(len(arr), sum(n * speeds[c] for c, n in by_chip.items()) / sum(by_chip.values()))
    _enough_pretraining(cluster, rng, kinds, sizes, durations * sizes * mean, window * mean,
                        target_work)  # fmt: skip
    train = kinds == "train"
    best = mean
    for _ in range(2):  # run times at the chips' speeds, then chips by those run times
        other = float((sizes * durations * best)[~train].sum())
        durations[train] = _train_durations(
            u[train], sizes[train] * best[train], target_work - other, window[train]
        )
        chips, best = balanced_chips(cluster, speeds, arr[:, 0], sizes, durations, pinned, horizon)
    other = float((sizes * durations * best)[~train].sum())
    durations[train] = _train_durations(
        u[train], sizes[train] * best[train], target_work - other, window[train]
    )
    return [
        _job_record(i, float(arr[i, 0]), str(kinds[i]), int(sizes[i]), float(durations[i]),
                    chips[i], float(best[i]))
        for i in range(len(arr))
    ]  # fmt: skip


def _standing_runs(cluster, rng, arr, kinds, sizes, u):
    """A cluster never starts empty: at time 0 the trace holds the standing pretraining
    runs (sizes from the pretraining distribution, run times from the tail above p90)
    until they add up to STANDING_RUNS_SHARE of the devices."""
    warm: list[int] = []
    while sum(warm) < cal.STANDING_RUNS_SHARE * cluster.num_devices:
        warm.append(int(_sizes(cluster, rng, np.array(["train"]))[0]))
    n = len(warm)
    head = np.column_stack([np.zeros(n), np.full(n, -1.0)])
    return (
        np.concatenate([head, arr]),
        np.concatenate([np.array(["train"] * n, dtype=kinds.dtype), kinds]),
        np.concatenate([np.array(warm, dtype=sizes.dtype), sizes]),
        np.concatenate([rng.uniform(0.9, 1.0, size=n), u]),
    )


def _enough_pretraining(cluster, rng, kinds, sizes, work, reach, target) -> None:
    """Short periods or small clusters have too few pretraining jobs to carry the load:
    turn evaluation jobs into pretraining jobs (in place) until they could."""
    for _ in range(20):
        train = kinds == "train"
        room = float((sizes * reach)[train].sum())
        need = 1.3 * (target - float(work[~train].sum()))
        if room >= need:
            return
        evals = np.flatnonzero(kinds == "eval")
        per_job = float(np.mean(sizes[train])) if train.any() else 128.0
        k = min(len(evals), max(1, int((need - room) / (per_job * float(reach.mean())))))
        pick = rng.choice(evals, size=k, replace=False)
        kinds[pick] = "train"
        sizes[pick] = _sizes(cluster, rng, np.array(["train"] * k))
        work[pick] = 0.0


def _sizes(cluster: Cluster, rng, kinds: np.ndarray) -> np.ndarray:
    out = np.zeros(len(kinds), dtype=int)
    for kind, (values, probs) in cal.SIZE_CHOICES.items():
        mask = kinds == kind
        out[mask] = rng.choice(values, size=int(mask.sum()), p=probs)
    smallest_group = min(g.num_devices for g in cluster.groups)
    cap = max(cal.PRETRAIN_MIN_DEVICES, int(cluster.num_devices * cal.PRETRAIN_CAP_FRACTION))
    cap = min(cap, smallest_group)
    mask = kinds == "train"
    out[mask] = _pretrain_sizes(rng, int(mask.sum()), cap)
    return np.minimum(out, smallest_group)


def _pretrain_sizes(rng, n: int, cap: int) -> np.ndarray:
    """A quarter at each Seren quartile (64, 128, 256), the top quarter log-uniform over
    powers of two from 512 to `cap` (at the third quartile when `cap` is below 512)."""
    low = int(math.log2(cal.PRETRAIN_QUARTILES[-1])) + 1
    top = int(math.log2(max(cap, 1)))
    quartile = rng.integers(0, 4, size=n)
    body = np.array(cal.PRETRAIN_QUARTILES)[np.minimum(quartile, 2)]
    if top < low:
        return body
    tail = 2 ** rng.integers(low, top + 1, size=n)
    return np.where(quartile == 3, tail, body)


def _train_durations(u: np.ndarray, rate: np.ndarray, target: float, window: np.ndarray):
    """Body from the Seren pretrain quantiles; the tail above p90 stretched to a maximum
    T found by bisection so the jobs' work within the period adds up to `target`; each
    run time is then cut at the end of the period (what is offered is what can run).
    When the period is too short for the p90 tail alone to carry the load (few
    pretraining jobs), the tail starts at a lower quantile (p75, p50, p25, p0)."""
    table = cal.DURATION_QUANTILES["train"]
    for q in (0.9, 0.75, 0.5, 0.25, 0.0):
        durations, reached = _solve_tail(u, rate, target, window, table, q)
        if reached:
            break
    return durations


def _solve_tail(u, rate, target, window, table, q):
    body = sample_quantiles(None, table, np.minimum(u, q))
    start = float(sample_quantiles(None, table, np.array([q]))[0])
    tail = u > q

    def durations(t_max: float) -> np.ndarray:
        d = body.copy()
        d[tail] = start * (t_max / start) ** ((u[tail] - q) / (1 - q))
        return np.minimum(d, window)

    lo, hi = start, 1e60
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if float((durations(mid) * rate).sum()) < target:
            lo = mid
        else:
            hi = mid
    return durations(hi), float((durations(hi) * rate).sum()) >= 0.99 * target


BALANCE_BIN_S = 3600.0


def balanced_chips(cluster: Cluster, speeds, submit, sizes, durations, pinned, horizon):
    """Each job's accepted chips, chosen in submit order so that every pool is offered
    its share of capacity over time: a job accepts the chip types of one vendor (or, when
    `pinned`, one chip type), and goes to the choice whose offered work over the job's
    own run, hour by hour, is lowest against that choice's capacity (devices x speed).
    A job offers `size` devices at its fastest accepted chip's speed from its submission
    for `duration`; work offered to several chip types is spread over them by capacity.
    Deterministic: no random draws. Returns (chips per job, fastest accepted speed)."""
    names = list(cluster.devices_by_chip())
    cap = np.array([cluster.devices_by_chip()[c] * speeds[c] for c in names])
    free, pins = [], [[c] for c in names]
    for g in cluster.groups:
        if not any(g.chip.vendor == v for v, _ in free):
            free.append((g.chip.vendor, []))
        chips = next(cs for v, cs in free if v == g.chip.vendor)
        if g.chip.id not in chips:
            chips.append(g.chip.id)
    choices = [[cs for _, cs in free], pins]
    tables = [_choice_table(names, cap, speeds, opts) for opts in choices]
    if len(names) == 1:  # one chip type: nothing to balance
        return [list(names)] * len(submit), np.full(len(submit), tables[0][3][0])
    bins = max(1, int(math.ceil(horizon / BALANCE_BIN_S)))
    load = np.zeros((len(names), bins))
    pick = np.zeros(len(submit), dtype=int)
    for i in np.argsort(submit, kind="stable"):
        member, share, total, fastest = tables[int(pinned[i])]
        a = min(int(submit[i] // BALANCE_BIN_S), bins - 1)
        b = min(max(a + 1, int(math.ceil((submit[i] + durations[i]) / BALANCE_BIN_S))), bins)
        add = sizes[i] * fastest * durations[i] / (BALANCE_BIN_S * (b - a))
        have = member @ load[:, a:b].sum(axis=1) / (b - a)
        k = int(np.argmin((have + add) / total)) if len(total) > 1 else 0
        load[:, a:b] += (share[k] * add[k])[:, None]
        pick[i] = k
    chips = [choices[int(p)][k] for p, k in zip(pinned, pick, strict=True)]
    best = np.array([tables[int(p)][3][k] for p, k in zip(pinned, pick, strict=True)])
    return chips, best


def _choice_table(names, cap, speeds, options):
    """Per option: which chips it holds (0/1), each chip's share of its capacity, its
    capacity and its fastest chip's speed."""
    member = np.array([[c in opt for c in names] for opt in options], dtype=float)
    total = member @ cap
    share = member * cap / total[:, None]
    fastest = np.array([max(speeds[c] for c in opt) for opt in options])
    return member, share, total, fastest


def _job_record(i, submit, kind, size, duration, chips, speed) -> TraceRecord:
    common = {
        "id": f"j{i:07d}", "submit_s": round(submit, 3), "kind": kind, "queue": kind,
        "priority": cal.PRIORITY[kind], "chips": chips,
        "work_device_s": round(max(1.0, size * duration * speed), 1),
        "checkpoint_interval_s": cal.CHECKPOINT_INTERVAL_S[kind],
    }  # fmt: skip
    if kind == "train":
        low = max(8, int(size * cal.ELASTIC_MIN_FRACTION) // 8 * 8)
        return TraceRecord(**common, min_devices=min(low, size), max_devices=size)
    return TraceRecord(**common, devices=size)


# ---- queues ---------------------------------------------------------------------------
def _queues(cluster: Cluster, services: list[TraceRecord]) -> dict:
    by_chip = cluster.devices_by_chip()
    guarantee = dict.fromkeys(by_chip, 0)
    for s in services:
        guarantee[s.chips[0]] += int(s.devices)
    rest = {c: by_chip[c] - guarantee[c] for c in by_chip}
    pre = {c: int(rest[c] * 0.7) for c in by_chip}
    res = {c: rest[c] - pre[c] for c in by_chip}
    split = {"finetune": 0.6, "eval": 0.3, "debug": 0.1}

    def quota(values: dict[str, int], **extra) -> dict:
        return {c: {"nominal": int(v), **{k: int(x[c]) for k, x in extra.items()}}
                for c, v in values.items()}  # fmt: skip

    research = [
        {"name": name, "quota": quota({c: int(res[c] * share) for c in by_chip})}
        for name, share in split.items()
    ]
    return {
        "queues": [
            {
                "name": "lab",
                "children": [
                    {"name": "serving", "children": [
                        {"name": "infer",
                         "quota": quota(guarantee, guarantee=guarantee, ceiling=guarantee)},
                    ]},
                    {"name": "pretraining", "children": [
                        {"name": "train", "quota": quota(pre)},
                    ]},
                    {"name": "research", "children": research},
                ],
            }
        ]
    }  # fmt: skip
