"""The generator offers every chip pool its capacity, flat over the period.

For random clusters of 1-4 vendors (one or two chip types each, 256-768 devices a pool)
and random seeds, the work each pool is offered over every 2-day window (sliding by a
day; a job offers its nominal size at its fastest accepted chip's speed from its
submission for its run time, work offered to several chip types shared over them to
even out their load; inference at its daily mean) divided by the pool's capacity:
(1) stays within BAND of the whole cluster's offered work over its capacity in that
window, and (2) after a warm-up day, within FLAT of the capacity itself in every 1-day
window. Drawing each job's vendor independently in proportion to devices broke (1) on 5
of 11 random clusters (ratios 0.02-2.02 on 6-day traces); a per-job balanced assignment
with pretraining drawn as bursts kept 0.65-1.44 over 36 random clusters but offered the
3-chip mix 69-146% of its capacity a day over 30 days. Both bands are wide for pools
that one pretraining run can fill (a job larger than a pool's share is offered to one
pool whatever the order): a pool may also miss them by one job's work.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.hardware.catalog import default_catalog
from argosy.hardware.loader import load_cluster
from argosy.scheduler.speed import relative_speed
from argosy.sim.generate import generate

VENDORS = {
    "nvidia": ["a100-80g", "h100-sxm", "h200", "b200"],
    "amd": ["mi300x", "mi250x"],
    "huawei": ["910b"],
    "intel": ["gaudi3"],
}
DAYS = 6
WINDOW_H = 48
BAND = (0.6, 1.5)
FLAT = (0.8, 1.2)


@st.composite
def cluster_specs(draw) -> str:
    vendors = draw(st.lists(st.sampled_from(list(VENDORS)), min_size=1, max_size=4, unique=True))
    parts = []
    for v in vendors:
        chips = draw(st.lists(st.sampled_from(VENDORS[v]), min_size=1, max_size=2, unique=True))
        parts += [f"{c}:{8 * draw(st.integers(32, 96))}" for c in chips]
    return "+".join(parts)


def window_ratios(spec: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per 2-day window (rows) and pool (columns): the pool's offered batch work over its
    capacity, divided by the cluster's; and one job's worth of that ratio (the largest
    single job's work in the window over the pool's fair share of it), by which no
    assignment of whole jobs can avoid missing the fair share."""
    level, largest, cap, fair = window_levels(spec, seed, DAYS, WINDOW_H, infer=False)
    return level / fair[:, None], largest[:, None] / (fair[:, None] * cap)


def window_levels(spec: str, seed: int, days: int, window_h: int, infer: bool):
    """Per window of `window_h` hours sliding by a day (rows) and pool (columns): the
    pool's offered work over its capacity in the window; the largest single job's work
    in each window (device-seconds at speed); pool capacities per window; and the whole
    cluster's offered work over its capacity per window. Work a job offers to one chip
    type counts on that pool; work offered to a vendor's several chip types is spread over
    them to even out their load (as a scheduler would place it), not by a fixed split;
    with `infer`, services count at their mean load on their pool."""
    cluster = load_cluster(spec)
    gen = generate(cluster, days=days, seed=seed)
    catalog, have = default_catalog(), cluster.devices_by_chip()
    speed = {c: relative_speed(c) for c in have}
    pools, hours = list(have), days * 24
    cap = np.array([have[c] * speed[c] for c in pools]) * window_h * 3600.0
    sets = sorted({tuple(sorted(catalog.get(c).id for c in r.chips)) for r in gen.records})
    edges = np.arange(hours + 1) * 3600.0
    work = np.zeros((len(sets), hours))
    starts = range(0, hours - window_h + 1, 24)
    largest = np.zeros(len(starts))  # the largest one job's work in each window
    for r in gen.records:
        chips = tuple(sorted(catalog.get(c).id for c in r.chips))
        if r.kind == "infer":
            if infer:
                work[sets.index(chips)] += (
                    r.devices * np.mean(r.load_profile) * 3600.0 * speed[chips[0]]
                )
            continue
        size = r.device_range[1]
        fastest = max(speed[c] for c in chips)
        start, end = r.submit_s, min(r.submit_s + r.work_device_s / size / fastest, edges[-1])
        a, b = int(start // 3600), min(int(np.ceil(end / 3600)), hours)
        overlap = np.minimum(edges[a + 1 : b + 1], end) - np.maximum(edges[a:b], start)
        job = np.zeros(hours)
        job[a:b] = np.clip(overlap, 0, None) * size * fastest
        work[sets.index(chips)] += job
        cum = np.concatenate([[0.0], np.cumsum(job)])
        for w, s in enumerate(starts):
            largest[w] = max(largest[w], cum[s + window_h] - cum[s])
    rows, fair = [], []
    for s in starts:
        offered = work[:, s : s + window_h].sum(axis=1)
        rows.append(_even_out(pools, cap, sets, offered))
        fair.append(offered.sum() / cap.sum())
    return np.array(rows), largest, cap, np.array(fair)


def _even_out(pools, cap, sets, offered) -> np.ndarray:
    """Each pool's load (work over capacity): single-chip work where it must run, then
    each multi-chip set's work poured into its chips' lowest levels (water-filling)."""
    held = np.zeros(len(pools))
    for chips, w in zip(sets, offered, strict=True):
        if len(chips) == 1:
            held[pools.index(chips[0])] += w
    level = held / cap
    for chips, w in zip(sets, offered, strict=True):
        if len(chips) == 1:
            continue
        idx = [pools.index(c) for c in chips]
        lo, hi = 0.0, float(level[idx].max() + w / cap[idx].sum())
        for _ in range(60):  # the common level the set's work fills its chips up to
            mid = (lo + hi) / 2
            poured = float((np.maximum(mid - level[idx], 0) * cap[idx]).sum())
            lo, hi = (mid, hi) if poured < w else (lo, mid)
        level[idx] = np.maximum(level[idx], hi)
    return level


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=cluster_specs(), seed=st.integers(0, 1000))
def test_every_pool_is_offered_its_share_in_every_window(spec, seed):
    """Within BAND, or off the fair share by no more than one job's work (a pool of 512
    devices that one large pretraining run fills: a100-80g:512+mi300x:512, seed 62, read
    1.62 in its first window)."""
    ratios, slack = window_ratios(spec, seed)
    inside = (ratios >= BAND[0]) & (ratios <= BAND[1])
    assert (inside | (np.abs(ratios - 1) <= slack)).all(), (spec, seed, ratios.round(2))


def test_the_3_chip_mix_keeps_its_910b_pool_busy():
    """The case that showed the problem, at a fifth of its size over 6 days: the 910b
    pool's 2-day windows stay within 0.75-1.25 of the cluster's offered load (0.77-0.96
    when this was written; 0.65 with vendors drawn in proportion to devices)."""
    ratios, _ = window_ratios("a100-80g:1600+h100-sxm:1600+910b:800", seed=0)
    assert ratios.min() >= 0.75 and ratios.max() <= 1.25, ratios.round(2)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=cluster_specs(), seed=st.integers(0, 1000))
def test_every_pool_is_offered_its_capacity_every_day(spec, seed):
    """After a warm-up day, every pool's offered work (inference included) over its
    capacity lies within FLAT in every day, or off 1.0 by no more than one job's work.
    A small pool once read 0.58 (`910b:280` seed 272, day 2) before the generator filled
    the hours its forward-only pretraining placement left behind: see the test below."""
    level, largest, cap, _ = window_levels(spec, seed, days=4, window_h=24, infer=True)
    level, slack = level[1:], largest[1:, None] / cap
    inside = (level >= FLAT[0]) & (level <= FLAT[1])
    assert (inside | (np.abs(level - 1) <= slack)).all(), (spec, seed, level.round(2))


def test_a_small_pool_has_no_day_left_under_offered():
    """The misses a random search found: pools of 280 devices where a large pretraining
    run waited for room, leaving the hours before it under-offered (0.58 and 0.74 of the
    capacity on day 2 before `_fill_holes`)."""
    for seed in (272, 273):
        level, _, _, _ = window_levels("910b:280", seed, days=4, window_h=24, infer=True)
        assert (level[1:] >= FLAT[0]).all() and (level[1:] <= FLAT[1]).all(), level.round(2)
