"""Batch shares that follow measured speeds: the pure rebalancing logic (properties) and
the rank-side bookkeeping (slices, checkpoint state, policy), no processes."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.runtime.mixed.emulate import Throttle
from argosy.runtime.mixed.plan import (
    GroupLayout,
    MixedLayout,
    assign_ranks,
    decode_assignment,
    encode_assignments,
    layout_from_doc,
)
from argosy.runtime.mixed.rank import MixedRank
from argosy.runtime.mixed.rebalance import (
    RebalancePolicy,
    balanced_shares,
    decide,
    group_sample_s,
    step_s,
)

speeds = st.floats(min_value=0.05, max_value=20.0, allow_nan=False)


@st.composite
def mixes(draw: st.DrawFn) -> tuple[int, list[float], list[int], int]:
    """(global batch, seconds per sample per group, devices per group, min per rank)."""
    groups = draw(st.integers(1, 4))
    devices = draw(st.lists(st.integers(1, 4), min_size=groups, max_size=groups))
    times = draw(st.lists(speeds, min_size=groups, max_size=groups))
    floor = draw(st.integers(1, 3))
    batch = draw(st.integers(floor * sum(devices), floor * sum(devices) + 80))
    return batch, times, devices, floor


@given(mixes())
def test_shares_sum_to_the_batch_and_respect_the_floor(mix: tuple) -> None:
    batch, times, devices, floor = mix
    shares = balanced_shares(batch, times, devices, floor)
    assert sum(shares) == batch
    assert all(s >= floor * d for s, d in zip(shares, devices, strict=True))


@given(mixes())
@settings(max_examples=60)
def test_shares_are_optimal_for_the_model(mix: tuple) -> None:
    """No integer split of the batch (over every rank's floor) has a shorter step."""
    batch, times, devices, floor = mix
    if len(devices) > 3 or batch - floor * sum(devices) > 40:
        return  # exhaustive search stays small
    best = step_s(balanced_shares(batch, times, devices, floor), times, devices)
    spare = batch - floor * sum(devices)
    for extra in itertools.product(range(spare + 1), repeat=len(devices) - 1):
        if sum(extra) > spare:
            continue
        shares = [floor * d + e for d, e in zip(devices, [*extra, spare - sum(extra)], strict=True)]
        assert step_s(shares, times, devices) >= best - 1e-12


@given(mixes(), st.data())
def test_a_faster_group_never_gets_fewer_samples(mix: tuple, data: st.DataObject) -> None:
    batch, times, devices, floor = mix
    group = data.draw(st.integers(0, len(devices) - 1))
    factor = data.draw(st.floats(min_value=0.1, max_value=1.0))
    before = balanced_shares(batch, times, devices, floor)
    faster = [t * factor if g == group else t for g, t in enumerate(times)]
    assert balanced_shares(batch, faster, devices, floor)[group] >= before[group]


@given(mixes(), st.integers(0, 2**32 - 1), st.floats(min_value=0.0, max_value=0.02))
@settings(max_examples=80)
def test_noise_below_the_hysteresis_never_oscillates(mix: tuple, seed: int, noise: float) -> None:
    """Measured times within +-2% of the true ones (< the 5% hysteresis): every adopted
    change shortens the true step, so no split comes back, and after one change at the
    true optimum nothing moves again."""
    batch, times, devices, floor = mix
    policy = RebalancePolicy(min_rank_samples=floor)
    rng = random.Random(seed)
    shares = [floor * d for d in devices]
    shares[0] += batch - sum(shares)  # start far from balance: all spare on group 0
    seen, true_step = [shares], step_s(shares, times, devices)
    for _ in range(40):
        measured = [t * (1 + rng.uniform(-noise, noise)) for t in times]
        decision = decide(shares, measured, devices, policy)
        if decision.changed:
            shares = decision.shares
            now = step_s(shares, times, devices)
            assert now < true_step and shares not in seen
            seen.append(shares)
            true_step = now
    optimum = balanced_shares(batch, times, devices, floor)
    for _ in range(20):
        measured = [t * (1 + rng.uniform(-noise, noise)) for t in times]
        assert not decide(optimum, measured, devices, policy).changed


def test_the_issue_mix_moves_one_sample_to_the_h100() -> None:
    """H100 + 2 A100 at the peak ratio 3.17 (989 / 312): the plan's 21 / 15 (A100 ranks
    8 + 7) leaves the A100 with 8 samples as the straggler; 22 / 14 (7 + 7) balances."""
    times = [1.0, 989 / 312]
    decision = decide([21, 15], times, [1, 2], RebalancePolicy())
    assert decision.changed and decision.shares == [22, 14]
    assert decision.gain == pytest.approx(1 - 7 * 989 / 312 / (8 * 989 / 312))
    # at the planner's own ratio (2.71) its split is already the best one
    assert not decide([21, 15], [1.0, 2.71], [1, 2], RebalancePolicy()).changed


def test_a_small_gain_is_not_taken() -> None:
    """10 / 10 takes 11.2, the best split 11 / 9 takes 11: 1.8% is inside the 5% band."""
    times, devices = [1.0, 1.12], [1, 1]
    assert balanced_shares(20, times, devices) == [11, 9]
    kept = decide([10, 10], times, devices, RebalancePolicy())
    assert not kept.changed and kept.gain == pytest.approx(1 - 11 / 11.2)
    assert decide([10, 10], times, devices, RebalancePolicy(min_gain=0.0)).changed


def test_group_time_is_its_slowest_rank() -> None:
    assert group_sample_s([0.01, 0.03, 0.032], [0, 1, 1]) == [0.01, 0.032]


@given(st.lists(st.integers(1, 3), min_size=2, max_size=4), st.data())
def test_new_shares_still_partition_the_batch(devices: list[int], data: st.DataObject) -> None:
    """After any re-split, the ranks' slices cover [0, global batch) once each."""
    batch = data.draw(st.integers(sum(devices), sum(devices) + 50))
    groups = tuple(GroupLayout("c", d, 0, 2, 1, None, 1.0) for d in devices)
    doc = {"layout": json.loads(json.dumps(_asdict(MixedLayout("batch", groups, batch, 1.0))))}
    times = data.draw(st.lists(speeds, min_size=len(devices), max_size=len(devices)))
    shares = balanced_shares(batch, times, devices)
    ranks = assign_ranks(layout_from_doc(doc["layout"], shares))
    covered = [i for r in ranks for i in range(r.sample_offset, r.sample_offset + r.samples)]
    assert covered == list(range(batch))
    assert sum(r.weight for r in ranks) == pytest.approx(1.0)
    assert all(r.samples >= 1 for r in ranks)


def test_layout_from_doc_refuses_shares_that_change_the_batch() -> None:
    groups = (GroupLayout("a", 1, 10, 2, 1, None, 1.0), GroupLayout("b", 2, 8, 2, 1, None, 1.0))
    doc = _asdict(MixedLayout("batch", groups, 18, 1.0))
    with pytest.raises(ValueError, match="global batch 18"):
        layout_from_doc(doc, [10, 9])


def _mixed_rank(rank: int, rebalance: dict | None, split: str = "batch") -> MixedRank:
    groups = (GroupLayout("h", 1, 10, 2, 1, None, 1.0), GroupLayout("a", 2, 8, 2, 1, None, 1.0))
    layout = MixedLayout(split, groups, 18, 1.0)
    text = encode_assignments(layout, assign_ranks(layout), {"rebalance": rebalance})
    assignment, doc = decode_assignment(text, rank)
    return MixedRank(assignment, doc, Throttle(0.0))


def test_checkpoint_state_restores_the_shares_and_the_slice() -> None:
    before = _mixed_rank(2, RebalancePolicy().model_dump())
    before.apply_shares([14, 4])
    before.changes.append({"step": 3, "from": [10, 8], "to": [14, 4]})
    after = _mixed_rank(2, RebalancePolicy().model_dump())
    assert after.assignment.samples == 4  # 8 over 2 ranks, as planned
    after.load_state_dict(json.loads(json.dumps(before.state_dict())))
    assert after.shares == [14, 4] and after.assignment == before.assignment
    assert (after.assignment.sample_offset, after.assignment.samples) == (16, 2)
    assert after.assignment.weight == pytest.approx(2 / 18)
    report = after.shares_report()
    assert report["planned"] == [10, 8] and report["used"] == [14, 4]
    assert report["changes"][0]["step"] == 3


@pytest.mark.parametrize(
    "rebalance,split,on",
    [
        (RebalancePolicy().model_dump(), "batch", True),
        (RebalancePolicy(enabled=False).model_dump(), "batch", False),
        (None, "batch", False),  # an assignment written before rebalancing existed
        (RebalancePolicy().model_dump(), "layers", False),  # pipeline stages: as planned
    ],
)
def test_policy_applies_to_enabled_batch_splits_only(
    rebalance: dict | None, split: str, on: bool
) -> None:
    assert (_mixed_rank(0, rebalance, split).policy() is not None) is on


def test_prepare_records_the_opt_out(tmp_path: Path) -> None:
    from argosy.runtime.mixed.launching import prepare

    plan = {
        "global_batch": 18,
        "plans": [
            {
                "parallel": {},
                "predicted": {"step_time_s": 1.0},
                "split": "batch",
                "groups": [
                    {"chip": "h100", "devices": 1, "parallel": {"mbs": 2}, "batch_share": 10},
                    {"chip": "a100-80g", "devices": 2, "parallel": {"mbs": 2}, "batch_share": 8},
                ],
            }
        ],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    env = prepare(path, "h100:1,a100-80g:2", 3, tmp_path / "off", RebalancePolicy(enabled=False))
    doc = json.loads(Path(env["ARGOSY_MIXED"]).read_text())
    assert doc["rebalance"]["enabled"] is False
    env = prepare(path, "h100:1,a100-80g:2", 3, tmp_path / "on")
    assert json.loads(Path(env["ARGOSY_MIXED"]).read_text())["rebalance"]["enabled"] is True


def _asdict(layout: MixedLayout) -> dict:
    from dataclasses import asdict

    return asdict(layout)
