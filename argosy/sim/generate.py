"""`argosy sim generate`: a synthetic LLM-cluster trace calibrated to public traces.

    gen = generate(cluster, days=30, seed=0)         # GeneratedTrace
    gen.offered_load                                 # ~1.0 x what the cluster can do
    write_generated(gen, Path("runs/t"))             # trace.jsonl + queues.yaml

The mix: evaluation, fine-tuning and debug jobs arrive in bursts following the Helios
hour-of-day and weekday profile, with kinds, sizes and run times from Acme (Seren) per
job type; inference services have DLRM-like replica counts and a diurnal load.
Pretraining runs (elastic; Seren sizes and run times, the tail up to Seren's longest job)
are then placed one after another, each in the first hour with room for it, until every
chip pool is offered `load` times its capacity in every hour: offered load is flat over
the period and the same in every pool (`_pretraining`). Each job accepts one vendor's
chip types, or one chip type for a third of jobs; bursty jobs are spread over the
options by capacity (`spread`). Constants and sources: `argosy.sim.calibration`.
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
    jobs = _batch_jobs(cluster, rng, horizon, speeds, infer_work, load)
    jobs = _within_reach(jobs, _reach(cluster, services))
    records = sorted(services + jobs, key=lambda r: r.submit_s)
    offered = (infer_work.sum() + sum(r.work_device_s for r in jobs)) / capacity
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


def _reach(cluster: Cluster, services: list[TraceRecord]) -> dict[str, int]:
    """Most devices of each chip a gang of fixed size can ever hold: its largest node
    group, less the peak replicas of the services pinned to the chip (fifo and quota keep
    them; `argosy.scheduler.fit.never_fits`)."""
    reserved: dict[str, int] = {}
    for s in services:
        reserved[s.chips[0]] = reserved.get(s.chips[0], 0) + int(s.devices or 0)
    largest: dict[str, int] = {}
    for g in cluster.groups:
        largest[g.chip.id] = max(largest.get(g.chip.id, 0), g.num_devices)
    have = cluster.devices_by_chip()
    return {c: max(1, min(largest[c], n - reserved.get(c, 0))) for c, n in have.items()}


def _within_reach(jobs: list[TraceRecord], reach: dict[str, int]) -> list[TraceRecord]:
    """Pretraining jobs whose `max_devices` no policy without elasticity could ever place
    (it starts them at that size) get the most the chips they accept can give; their work
    is the same, so only the gang is smaller. A fifo or quota replay then runs them
    instead of refusing them, which would inflate a `--compare` ratio."""
    out = []
    for job in jobs:
        most = max((reach.get(c, 0) for c in job.chips), default=0)
        if job.max_devices is not None and most and job.max_devices > most:
            least = min(job.min_devices or most, most)
            job = job.model_copy(update={"max_devices": most, "min_devices": least})
        out.append(job)
    return out


def _services(
    cluster: Cluster, rng, horizon: float, speeds
) -> tuple[list[TraceRecord], np.ndarray]:
    """Services per chip pool in proportion to its devices (at least one each), their
    peaks summing to `INFER_PEAK_SHARE` of every pool: no pool serves more than its
    share, so batch work sees the same room everywhere. Returns them and the work they
    offer per pool at their mean load."""
    by_chip = cluster.devices_by_chip()
    total = cluster.num_devices
    count = max(len(by_chip), round(total / 1000 * cal.INFER_SERVICES_PER_1K_DEVICES))
    counts = _apportion(count, np.array(list(by_chip.values()), dtype=float))
    sigma = math.log(cal.INFER_REPLICA_P90 / cal.INFER_REPLICA_MEDIAN) / 1.2816
    records, work = [], np.zeros(len(by_chip))
    for p, ((chip, devices), k) in enumerate(zip(by_chip.items(), counts, strict=True)):
        raw = rng.lognormal(math.log(cal.INFER_REPLICA_MEDIAN), sigma, size=int(k))
        peaks = np.maximum(1, np.floor(raw / raw.sum() * cal.INFER_PEAK_SHARE * devices))
        for peak in peaks.astype(int):
            profile = diurnal_profile(cal.INFER_PEAK_HOUR + float(rng.uniform(-2, 2)))
            work[p] += peak * float(np.mean(profile)) * horizon * speeds[chip]
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
BIN_S = 3600.0
HOLE = 0.15
"""How far under its target load an hour must be to be a hole `_fill_holes` fills: only
real holes, as every run it adds is one that fit (short runs fit more often)."""


@dataclass
class _Choices:
    """What a job may accept: the chip types of one vendor (`free`) or one chip type
    (`pinned`); per option its chips (names), which pools they are (0/1 rows), each
    pool's share of its capacity, its capacity and its fastest chip's speed."""

    names: list[list[str]]
    member: np.ndarray
    share: np.ndarray
    total: np.ndarray
    fastest: np.ndarray


def _choices(cluster: Cluster, speeds) -> tuple[np.ndarray, list[_Choices]]:
    """Pool capacities (devices x speed) and the [free, pinned] option tables."""
    have = cluster.devices_by_chip()
    pools = list(have)
    cap = np.array([have[c] * speeds[c] for c in pools])
    vendors: dict[str, list[str]] = {}
    for g in cluster.groups:
        chips = vendors.setdefault(g.chip.vendor, [])
        if g.chip.id not in chips:
            chips.append(g.chip.id)
    tables = []
    for options in (list(vendors.values()), [[c] for c in pools]):
        member = np.array([[c in opt for c in pools] for opt in options], dtype=float)
        total = member @ cap
        fastest = np.array([max(speeds[c] for c in opt) for opt in options])
        tables.append(_Choices(options, member, member * cap / total[:, None], total, fastest))
    return cap, tables


def _batch_jobs(cluster, rng, horizon, speeds, infer_work, load) -> list[TraceRecord]:
    """Evaluation, fine-tuning and debug jobs arrive in bursts (`_short_jobs`); pretraining
    runs are then placed so every pool is offered `load` x its capacity in every hour
    (`_pretraining`)."""
    n_jobs = cal.JOBS_PER_DEVICE_DAY * cluster.num_devices * horizon / DAY_S
    cap, tables = _choices(cluster, speeds)
    bins = max(1, int(math.ceil(horizon / BIN_S)))
    width = np.minimum(BIN_S, horizon - np.arange(bins) * BIN_S)
    level = np.outer(infer_work / horizon, width)  # offered work per pool and bin
    short = _short_jobs(cluster, rng, horizon, n_jobs * (1 - cal.KIND_SHARE["train"]), tables)
    submit, sizes, durations, pinned, pick = short[0], short[2], short[3], short[4], short[5]
    shares, fastest = (_per_job(tables, pinned, pick, a) for a in ("share", "fastest"))
    for p in range(len(cap)):
        rate = sizes * fastest * shares[:, p]
        level[p] += _hourly(submit, submit + durations, rate, bins)
    level /= cap[:, None] * width
    train = _pretraining(cluster, rng, horizon, cap, tables, level, width, load,
                         n_jobs * cal.KIND_SHARE["train"])  # fmt: skip
    names, fastest = [t.names for t in tables], [t.fastest.tolist() for t in tables]
    rows = zip(*(np.asarray(x).tolist() for x in short), strict=True)  # Python scalars
    jobs = [(t, kind, size, d, int(pin), k, names[pin][k]) for t, kind, size, d, pin, k in rows]
    jobs += train
    jobs.sort(key=lambda j: j[0])
    return [
        _job_record(i, t, kind, int(size), float(d), chips, fastest[pin][k])
        for i, (t, kind, size, d, pin, k, chips) in enumerate(jobs)
    ]


def _per_job(tables: list[_Choices], pinned, pick, attr: str) -> np.ndarray:
    """`attr` of each job's option: its row of the free or of the pinned table."""
    free, pins = getattr(tables[0], attr), getattr(tables[1], attr)
    out = free[np.minimum(pick, len(free) - 1)]
    out[pinned] = pins[pick[pinned]]
    return out


def _short_jobs(cluster, rng, horizon, n_expected, tables):
    """(submit, kind, size, run time, pinned, option) of every evaluation, fine-tuning and
    debug job: bursts of one kind and size (`_arrivals`), run times from the Acme
    quantiles, options spread over the pools by capacity (`spread`)."""
    arr = _arrivals(rng, horizon / DAY_S, n_expected)
    n_batches = int(arr[:, 1].max()) + 1 if len(arr) else 0
    kinds_list = [k for k in cal.KIND_SHARE if k != "train"]
    shares = np.array([cal.KIND_SHARE[k] for k in kinds_list])
    kind_of_batch = np.array(kinds_list)[rng.choice(len(kinds_list), size=n_batches,
                                                    p=shares / shares.sum())]  # fmt: skip
    batch = arr[:, 1].astype(int)
    kinds = kind_of_batch[batch]
    sizes = _sizes(cluster, rng, kind_of_batch)[batch]
    u = rng.uniform(0, 1, size=len(arr))
    durations = np.zeros(len(arr))
    for kind in kinds_list:
        mask = kinds == kind
        durations[mask] = sample_quantiles(rng, cal.DURATION_QUANTILES[kind], u[mask])
    submit = arr[:, 0]
    durations = np.minimum(durations, horizon - submit)
    pinned = rng.uniform(size=len(arr)) < cal.PINNED_CHIP_SHARE
    pick = spread(submit, sizes * durations, pinned, [t.total for t in tables], horizon)
    return submit, kinds, sizes, durations, pinned, pick


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


def spread(submit, work, pinned, totals: list[np.ndarray], horizon: float) -> np.ndarray:
    """Each job's option, in submit order, so every option takes its capacity share of
    the work submitted over any stretch of time: the jobs' work laid end to end on a
    wheel of ten minutes' submitted work cut in arcs by capacity, each job going to the
    arc that holds its midpoint (systematic sampling; no random draws, vectorised)."""
    pick = np.zeros(len(submit), dtype=int)
    order = np.argsort(submit, kind="stable")
    for p, total in enumerate(totals):
        idx = order[pinned[order] == bool(p)]
        if len(total) == 1 or not len(idx):
            continue
        w = work[idx]
        period = max(float(w.sum()) / max(horizon / 600.0, 1.0), 1e-9)
        where = ((np.cumsum(w) - w / 2) / period) % 1.0
        bounds = np.cumsum(total / total.sum())
        pick[idx] = np.minimum(np.searchsorted(bounds, where, side="right"), len(total) - 1)
    return pick


def _hourly(start, end, rate, bins: int) -> np.ndarray:
    """Work per `BIN_S` bin of jobs running at `rate` from `start` to `end` (s)."""
    a = np.minimum((start // BIN_S).astype(int), bins - 1)
    b = np.minimum((end // BIN_S).astype(int), bins - 1)
    one = a == b
    out = np.zeros(bins)
    out += np.bincount(a[one], (rate * (end - start))[one], minlength=bins)
    a, b, start, end, rate = a[~one], b[~one], start[~one], end[~one], rate[~one]
    out += np.bincount(a, rate * ((a + 1) * BIN_S - start), minlength=bins)
    out += np.bincount(b, rate * (end - b * BIN_S), minlength=bins)
    inner = np.bincount(a + 1, rate, minlength=bins + 1) - np.bincount(b, rate, minlength=bins + 1)
    return out + np.cumsum(inner)[:bins] * BIN_S


def _pretraining(cluster, rng, horizon, cap, tables, level, width, load, n_expected):
    """Pretraining runs placed one after another until every pool is offered `load` x its
    capacity in every hour (a lab keeps its fleet busy: the next run starts when there is
    room for it). Each run's size, run time (`_tail_durations`) and pinning are drawn as
    usual; in draw order, each starts in the first hour, from the previous run's on, in
    which an option it may take (a vendor, or one chip type when pinned) has room for
    half of it, that hour and the next; it takes the option least loaded once it is
    added, and its work goes to that option's least loaded pools (`_pour`). Runs that
    would start after the period are left out. Updates `level` (offered work over
    capacity, per pool and hour) in place; returns (submit, kind, size, run time,
    pinned, option, chips) per run."""
    n = max(16, round(n_expected))
    sizes, u, pinned = _pretraining_draws(cluster, rng, n)
    durations = _tail_durations(u)
    out, misses, i, front = [], 0, 0, 0
    while misses < 32 and i < 50 * n + 1000:
        if i == len(sizes):
            more = _pretraining_draws(cluster, rng, n)
            sizes, u, pinned = (
                np.concatenate([x, y]) for x, y in zip((sizes, u, pinned), more, strict=True)
            )
            durations = _tail_durations(u)
        size, d, pin = int(sizes[i]), float(durations[i]), int(pinned[i])
        i += 1
        t = tables[pin]
        ahead = level[:, front:]
        ahead = np.maximum(ahead, np.concatenate([ahead[:, 1:], ahead[:, -1:]], axis=1))
        lvl = (t.member * cap) @ ahead / t.total[:, None]  # this hour or the next, if higher
        inc = size * t.fastest / t.total * min(1.0, d / BIN_S)
        room = lvl + inc[:, None] / 2 <= load
        if not room.any():  # it would start after the end of the period
            misses += 1
            continue
        misses = 0
        rel = int(room.any(axis=0).argmax())  # the start hour, counted from `front`
        k = int(np.argmin(np.where(room[:, rel], lvl[:, rel] + inc, np.inf)))
        rate = size * t.fastest[k] * _pour(ahead[:, rel], cap, t.member[k])
        front += rel
        submit, d = _start_run(rng, level, cap, width, horizon, front, d, rate)
        out.append((submit, "train", size, d, pin, k, t.names[k]))
    return out + _fill_holes(cluster, rng, horizon, cap, tables, level, width, load, n)


def _fill_holes(cluster, rng, horizon, cap, tables, level, width, load, n):
    """More pretraining runs, each in the first hour (from the start) that is a hole (its
    option under `load` by `HOLE`) and from which the option it takes stays at or under
    `load` with it added for its whole run time: the first pass only goes forward, so a
    large run that waited for room left the hours before it under-offered (a small pool
    could read 0.58 of its capacity for a day).
    Filling a hole never over-fills a later hour. Stops after 32 draws in a row that
    fit nowhere. Updates `level` in place; returns runs as `_pretraining` does."""
    bins = level.shape[1]
    out, misses, tries = [], 0, 0
    while misses < 32 and tries < 50 * n + 1000:
        sizes, u, pinned = _pretraining_draws(cluster, rng, n)
        draws = zip(sizes.tolist(), _tail_durations(u).tolist(), pinned.tolist(), strict=True)
        for size, d, pin in draws:
            tries += 1
            t = tables[int(pin)]
            lvl = (t.member * cap) @ level / t.total[:, None]
            inc = size * t.fastest / t.total * min(1.0, d / BIN_S)
            span = min(bins, max(1, int(np.ceil(d / BIN_S))))
            room = (_window_max(lvl, span) + inc[:, None] <= load) & (lvl < load - HOLE)
            if not room.any():
                misses += 1
                if misses >= 32:
                    break
                continue
            misses = 0
            h = int(room.any(axis=0).argmax())
            k = int(np.argmin(np.where(room[:, h], lvl[:, h] + inc, np.inf)))
            rate = size * t.fastest[k] * _pour(level[:, h], cap, t.member[k])
            submit, d = _start_run(rng, level, cap, width, horizon, h, d, rate)
            out.append((submit, "train", int(size), d, int(pin), k, t.names[k]))
    return out


def _start_run(rng, level, cap, width, horizon, h, d, rate):
    """A run submitted in hour `h` (at a random point of it, but at 0 in the first) for
    `d` s clipped to the period, its work (`rate` per pool) added to `level` in place;
    returns (submit, run time)."""
    submit = h * BIN_S + (float(rng.uniform(0, width[h])) if h else 0.0)
    d = min(d, horizon - submit)
    work = _hourly(np.array([submit]), np.array([submit + d]), np.ones(1), level.shape[1])
    level += np.outer(rate, work) / (cap[:, None] * width)
    return submit, d


def _window_max(values: np.ndarray, span: int) -> np.ndarray:
    """Per row, the max over each column and the `span - 1` after it (columns past the
    end count as nothing): doubling windows, O(log span) passes."""
    out, width = values.copy(), 1
    pad = np.full((values.shape[0], span), -np.inf)
    while width * 2 <= span:
        shifted = np.concatenate([out, pad], axis=1)[:, width : width + values.shape[1]]
        out, width = np.maximum(out, shifted), width * 2
    if width < span:  # the rest: a window of `width` starting span - width later
        shifted = np.concatenate([out, pad], axis=1)[
            :, span - width : span - width + values.shape[1]
        ]
        out = np.maximum(out, shifted)
    return out


def _pour(level: np.ndarray, cap: np.ndarray, member: np.ndarray) -> np.ndarray:
    """How a job offered to several pools (`member`) splits its work over them: poured
    into the least loaded first, as a scheduler would place it (water-filling; one job's
    worth of work is assumed, as a share of the option's capacity)."""
    if member.sum() == 1:
        return member
    idx = np.flatnonzero(member)
    amount = float(cap[idx].sum()) * 0.05  # a typical increment: 5% of the option
    lo, hi = float(level[idx].min()), float(level[idx].max()) + amount / float(cap[idx].sum())
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (
            (mid, hi) if (np.maximum(mid - level[idx], 0) * cap[idx]).sum() < amount else (lo, mid)
        )
    out = np.zeros(len(cap))
    out[idx] = np.maximum(hi - level[idx], 0) * cap[idx]
    return out / out.sum()


def _pretraining_draws(cluster, rng, n: int):
    sizes = _sizes(cluster, rng, np.array(["train"] * n))
    return sizes, rng.uniform(0, 1, size=n), rng.uniform(size=n) < cal.PINNED_CHIP_SHARE


def sample_quantiles(rng, table: dict[float, float], u: np.ndarray) -> np.ndarray:
    """Inverse-sample a quantile table with log-linear interpolation."""
    ps = np.array(list(table))
    logs = np.log(np.array(list(table.values())))
    return np.exp(np.interp(u, ps, logs))


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


def _tail_durations(u: np.ndarray) -> np.ndarray:
    """Pretraining run times: the Seren pretrain quantiles up to p90, log-uniform from
    there to Seren's longest GPU job (`PRETRAIN_MAX_RUN_S`)."""
    table = cal.DURATION_QUANTILES["train"]
    d = sample_quantiles(None, table, np.minimum(u, 0.9))
    tail = u > 0.9
    d[tail] = table[0.9] * (cal.PRETRAIN_MAX_RUN_S / table[0.9]) ** ((u[tail] - 0.9) / 0.1)
    return d


def _job_record(i, submit, kind, size, duration, chips, speed) -> TraceRecord:
    """One job's record, built without validation: every value is made here, in range by
    construction (`tests/sim` validates generated traces field by field), and a million
    validations were most of the time of a 100k-device month."""
    common = {
        "id": f"j{i:07d}", "submit_s": round(submit, 3), "kind": kind, "queue": kind,
        "priority": cal.PRIORITY[kind], "chips": chips,
        "work_device_s": round(max(1.0, size * duration * speed), 1),
        "checkpoint_interval_s": cal.CHECKPOINT_INTERVAL_S[kind],
    }  # fmt: skip
    if kind == "train":
        low = max(8, int(size * cal.ELASTIC_MIN_FRACTION) // 8 * 8)
        return TraceRecord.model_construct(**common, min_devices=min(low, size), max_devices=size)
    return TraceRecord.model_construct(**common, devices=size)


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
