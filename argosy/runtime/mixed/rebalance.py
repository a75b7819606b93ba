"""Batch shares that follow measured speeds: rebalance a mixed plan's data-parallel split.

The planner splits the global batch over chip groups by its cost model, which is never
exact on real mixed hardware. The runtime measures instead: every rank records its busy
time per step (its micro-batches' forward and backward, not the time it waits at the
all-reduce); after `warmup_steps`, every `window_steps` the ranks pool the median busy
seconds per sample of each rank, each group takes its slowest rank's, and the shares
that minimise the step's compute time for those speeds are computed. They are adopted
only when they promise at least `min_gain` (5%) less step time than the shares in use,
measured by the same speeds (hysteresis); the window then starts again on the new
shares. Pure: no torch, no processes; `rank.MixedRank` does the measuring and the
agreement (one all-reduce of every rank's median; each rank then computes the same
shares from the same numbers).

Model: a group of `devices` identical ranks with share S splits it as evenly as
integers allow (`plan.assign_ranks`), so its busiest rank computes ceil(S / devices)
samples, and the group's time is ceil(S / devices) x its seconds per sample. The global
batch is fixed, every rank keeps at least `min_rank_samples`. `balanced_shares` finds
the shares with the smallest largest group time (greedy by increments, optimal for
non-decreasing per-group costs): taking the B - sum(minimums) smallest increments over
all groups, ties broken by group index, so a faster group never gets fewer samples.

Why hysteresis cannot oscillate: if every measured time per sample is within a factor
(1 +- e) of the true one, a change needs measured times T'(old) > (1 + min_gain) T'(new), so it
divides the true step time by at least (1 + min_gain)(1 - e)/(1 + e) > 1 whenever
(1 + e)/(1 - e) < 1 + min_gain (e < 2.4% for 5%): the true step time falls at every
change, so no split is ever returned to. Layer splits (pipeline stages) are not
rebalanced: their layer counts stay as planned.

    policy = RebalancePolicy()
    times = group_sample_s([0.010, 0.031, 0.032], group_of_rank=[0, 1, 1])  # [0.010, 0.032]
    decision = decide([21, 15], times, devices=[1, 2], policy=policy)
    decision.shares if decision.changed else current           # [22, 14]
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class RebalancePolicy(BaseModel):
    """When and how a mixed launch re-splits its global batch (recorded in the launch's
    assignment document, `rebalance`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    enabled: bool = True
    """Rebalance at all (`argosy launch --no-rebalance` turns it off)."""
    warmup_steps: int = Field(1, ge=0)
    """Steps of each attempt left out of the measurement (start-up effects)."""
    window_steps: int = Field(2, ge=1)
    """Steps on the current shares pooled for one decision (median per rank)."""
    min_gain: float = Field(0.05, ge=0.0)
    """Adopt new shares only if the shares in use take more than (1 + min_gain) times
    their step time at the measured speeds."""
    min_rank_samples: int = Field(1, ge=1)
    """Fewest samples a rank may be given per step."""


@dataclass(frozen=True)
class Decision:
    """The outcome of one rebalance check."""

    shares: list[int]
    """The best shares for the measured speeds (adopted only if `changed`)."""
    changed: bool
    current_step_s: float
    """Modelled compute time per step of the shares in use, at the measured speeds."""
    best_step_s: float
    """Same for `shares`."""

    @property
    def gain(self) -> float:
        """Fraction of step time the new shares would save."""
        return 1.0 - self.best_step_s / self.current_step_s if self.current_step_s else 0.0


def group_sample_s(rank_sample_s: list[float], group_of_rank: list[int]) -> list[float]:
    """Each group's seconds per sample: its slowest rank's (a group waits for it)."""
    groups = max(group_of_rank) + 1
    out = [0.0] * groups
    for seconds, group in zip(rank_sample_s, group_of_rank, strict=True):
        out[group] = max(out[group], seconds)
    return out


def median_sample_s(busy_s: list[float], samples: list[int]) -> float:
    """Median over steps of busy seconds per sample (steps with no samples left out)."""
    per = [b / n for b, n in zip(busy_s, samples, strict=True) if n > 0]
    return statistics.median(per) if per else 0.0


def step_s(shares: list[int], sample_s: list[float], devices: list[int]) -> float:
    """Modelled compute time of a step: the slowest group's busiest rank."""
    return max(_rank_samples(s, d) * t for s, t, d in zip(shares, sample_s, devices, strict=True))


def balanced_shares(
    global_batch: int, sample_s: list[float], devices: list[int], min_rank_samples: int = 1
) -> list[int]:
    """Integer shares summing to `global_batch` with the smallest modelled step time.

    Every group starts at `min_rank_samples` per device; the remaining samples go, one
    at a time, where they raise that group's time the least (ties: lower group index)."""
    floors = [min_rank_samples * d for d in devices]
    spare = global_batch - sum(floors)
    if spare < 0:
        raise ValueError(
            f"global batch {global_batch} < {sum(floors)}: cannot give every rank "
            f"{min_rank_samples} sample(s)"
        )
    if any(t <= 0 or not math.isfinite(t) for t in sample_s):
        raise ValueError(f"seconds per sample {sample_s}: need positive, finite times")
    shares = list(floors)
    rows = zip(shares, sample_s, devices, strict=True)
    heap = [(_rank_samples(s + 1, d) * t, g) for g, (s, t, d) in enumerate(rows)]
    heapq.heapify(heap)
    for _ in range(spare):
        _, g = heapq.heappop(heap)
        shares[g] += 1
        heapq.heappush(heap, (_rank_samples(shares[g] + 1, devices[g]) * sample_s[g], g))
    return shares


def decide(
    current: list[int], sample_s: list[float], devices: list[int], policy: RebalancePolicy
) -> Decision:
    """The best shares for the measured `sample_s` per group, and whether to adopt them."""
    best = balanced_shares(sum(current), sample_s, devices, policy.min_rank_samples)
    now, then = step_s(current, sample_s, devices), step_s(best, sample_s, devices)
    changed = best != current and now > then * (1.0 + policy.min_gain)
    return Decision(best, changed, now, then)


def _rank_samples(share: int, devices: int) -> int:
    return -(-share // devices)
