"""When growing an elastic job pays, and how far it may grow.

A resize stalls every device of the job for `resize_cost` (checkpoint-resume: snapshot +
restart + restore by the job's size and state, `argosy.scheduler.resize_cost`, under a
policy whose runtime has that model; else a constant), and grown capacity is usually
taken back later (another stall). Growing `d` devices by `add` pays only if they are
expected to be held long enough:

    add x expected_hold >= resize_payback x (cost(d -> d + add) x (d + add)
                                             + cost(d + add -> d) x d)

and a job's resize stalls stay within `resize_budget_fraction` of the time it has run
(beyond one grow and one shrink), so the effective training time a resize costs is
bounded whatever the arrivals do. `expected_hold` is learnt per node group: the mean
time grown capacity was actually held before a shrink took it back or the job ended
(`initial_hold_s` until there is any, fading back to it as observations age). Capacity that the
group's inference services will need within that time (their load forecast) is not
grown into at all (looking ahead at most `SERVICE_LOOKAHEAD_S`), nor what pending work
asks for. Beyond their nominal size elastic jobs grow only past what pending work
asks for, up to `elastic_overgrow` x `max_devices`.
"""

from __future__ import annotations

import math

import numpy as np

from argosy.scheduler.workload import Workload

HOLD_WEIGHT = 0.2  # weight of a new observation in the running mean of hold times
SERVICE_LOOKAHEAD_S = 7200.0
HOLD_MEMORY_S = (
    6 * 3600.0
)  # an observed hold time fades over this  # inference need within this is never grown into


def max_size(sched, w: Workload) -> int:
    """Most devices `w` may hold: past `max_devices` only under an elastic policy (and
    then only into capacity no pending workload asks for: `pending_demand`)."""
    if not (sched.policy.elastic and w.elastic):
        return w.max_devices
    return int(w.max_devices * sched.config.elastic_overgrow)


def pending_demand(sched) -> dict[str, int]:
    """Devices pending workloads ask for, by the first (fastest) chip type they accept."""
    out: dict[str, int] = {}
    for shape, entries in sched.pending.by_shape.items():
        out[shape[1][0]] = out.get(shape[1][0], 0) + shape[2] * len(entries)
    return out


def expected_hold_s(sched, g: int, now: float) -> float:
    """The learnt hold time of group `g`, relaxing back to `initial_hold_s` as its last
    observation ages (time constant `HOLD_MEMORY_S`): a group that stopped growing
    because holds were short must be able to try again."""
    init = sched.config.initial_hold_s
    if g not in sched.hold_s:
        return init
    value, seen = sched.hold_s[g]
    return init + (value - init) * math.exp(-max(0.0, now - seen) / HOLD_MEMORY_S)


def observe_shrink(sched, w: Workload, now: float) -> None:
    """`w` gives capacity back (or ends): learn how long its last growth was held."""
    if w.grown_s >= 0 and w.alloc is not None:
        g, held = w.alloc.group, now - w.grown_s
        old = expected_hold_s(sched, g, now)
        sched.hold_s[g] = ((1 - HOLD_WEIGHT) * old + HOLD_WEIGHT * held, now)
    w.grown_s = -1.0


def lookaheads(sched, hold_s: float) -> tuple[tuple[float, float], ...]:
    """(horizon of the services' forecast, hold time credited) pairs growth considers:
    the learnt hold time (the forecast looked at over at most `SERVICE_LOOKAHEAD_S` of
    it) and, when a policy grows into inference troughs (`trough_growth`), shorter
    horizons `h` halving down to `forecast_lead_s`: capacity the services need only
    after `h` is held at least `h` before they take it back (urgently, shrinking the
    job), which can pay on its own."""
    longest = min(hold_s, SERVICE_LOOKAHEAD_S)
    out = [(longest, hold_s)]
    if not sched.policy.trough_growth:
        return tuple(out)
    lead = max(sched.config.forecast_lead_s, 1.0)
    h = longest / 2
    while h > lead:
        out.append((h, h))
        h /= 2
    if lead < longest:
        out.append((lead, lead))
    return tuple(out)


def pays(sched, w: Workload, add: int, hold_s: float) -> bool:
    d = w.devices
    grow_s, back_s = round_trip_s(sched, w, d, d + add)
    cost = grow_s * (d + add) + back_s * d
    return add * hold_s >= sched.config.resize_payback * cost


def round_trip_s(sched, w: Workload, d: int, grown: int) -> tuple[float, float]:
    """Stalls of growing `w` from `d` to `grown` devices and of shrinking it back."""
    return resize_cost(sched, w, d, grown), resize_cost(sched, w, grown, d)


def within_budget(sched, w: Workload, now: float, stall_s: float) -> bool:
    """Whether `w` may stand still `stall_s` more seconds for resizes: its stalls stay
    within `resize_budget_fraction` of the time it has run, plus one grow and one shrink
    at its present size."""
    cfg = sched.config
    d = w.devices
    allowance = 2 * resize_cost(sched, w, d, d)
    allowance += cfg.resize_budget_fraction * max(0.0, now - w.started_s)
    return w.resize_stall_s + stall_s <= allowance


def charge(sched, w: Workload, before: int, after: int) -> None:
    """`w` resizes now from `before` to `after` devices."""
    w.resize_stall_s += resize_cost(sched, w, before, after)


def resize_cost(sched, w: Workload, before: int, after: int) -> float:
    """Seconds a resize of `w` from `before` to `after` devices stops the whole job under
    this policy's runtime."""
    runtime = sched.policy.runtime
    if runtime.resize_model is not None:
        return runtime.resize_model.seconds(w.state_bytes, before, after)
    return runtime.resize_s or sched.config.resize_cost_s


def service_need(sched, chip: str, now: float, horizon_s: float) -> int:
    """Devices the services pinned to `chip` will add within `horizon_s` (forecast)."""
    need = 0
    for s in sched.services:
        if s.chips[0] != chip or s.profile is None:
            continue
        step, profile = s.profile_step_s, s.profile
        first = int(now // step) % len(profile)  # the profile repeats every day
        steps = math.ceil(horizon_s / step) + 1
        key = (s.id, first, steps)
        peak = sched.peak_ahead.get(key)
        if peak is None:
            ahead = np.arange(first, first + steps)
            peak = sched.peak_ahead[key] = float(profile[ahead % len(profile)].max())
        need += max(0, math.ceil(s.max_devices * peak - 1e-9) - s.replica_count)
    return need
