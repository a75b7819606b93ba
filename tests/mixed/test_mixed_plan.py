"""Plan -> rank assignments (pure), sample weights, and the plan/launch checks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.core.errors import ArgosyError
from argosy.hardware.catalog import default_catalog
from argosy.runtime.mixed.emulate import Throttle, canonical_counts, emulated_speeds
from argosy.runtime.mixed.plan import (
    GroupLayout,
    MixedLayout,
    PlanMismatchError,
    assign_ranks,
    check_launch,
    parse_chip_counts,
    parse_plan,
)
from argosy.runtime.mixed.weighting import micro_batch_scales, micro_batch_sizes, rank_weights

group_st = st.builds(
    lambda chip, devices, samples, mbs: GroupLayout(chip, devices, samples, mbs, 1, None, 1.0),
    st.sampled_from(["h100-sxm", "a100-80g", "910b", "cpu"]),
    st.integers(1, 5),
    st.integers(0, 64),
    st.integers(1, 8),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(group_st, min_size=1, max_size=4))
def test_batch_split_assignments_cover_the_global_batch_once(groups: list) -> None:
    total = sum(g.samples for g in groups)
    if total == 0:
        groups[0] = GroupLayout(groups[0].chip, groups[0].devices, 1, 1, 1, None, 1.0)
        total = 1
    layout = MixedLayout("batch", tuple(groups), total, 1.0)
    ranks = assign_ranks(layout)
    assert [r.rank for r in ranks] == list(range(layout.devices))
    covered = [i for r in ranks for i in range(r.sample_offset, r.sample_offset + r.samples)]
    assert covered == list(range(total))  # contiguous, in rank order, no overlap
    for index, g in enumerate(groups):
        mine = [r for r in ranks if r.group == index]
        assert len(mine) == g.devices and {r.chip for r in mine} == {g.chip}
        assert sum(r.samples for r in mine) == g.samples
        assert max(r.samples for r in mine) - min(r.samples for r in mine) <= 1
        for r in mine:
            assert r.micro_batches == len(micro_batch_sizes(r.samples, g.micro_batch))
    assert sum(r.weight for r in ranks) == pytest.approx(1.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 200), st.integers(1, 16))
def test_micro_batch_scales_sum_to_one(samples: int, micro_batch: int) -> None:
    sizes = micro_batch_sizes(samples, micro_batch)
    assert sum(sizes) == samples and max(sizes) <= micro_batch
    assert sum(micro_batch_scales(samples, micro_batch)) == pytest.approx(1.0)


def test_rank_weights_reject_an_empty_batch() -> None:
    assert rank_weights([2, 1, 1]) == [0.5, 0.25, 0.25]
    with pytest.raises(ValueError, match="samples per rank"):
        rank_weights([0, 0])


def test_layer_split_gives_stages_and_layer_counts() -> None:
    groups = (
        GroupLayout("b200", 1, 36, 1, 1, 19, 0.1),
        GroupLayout("h100-sxm", 2, 36, 1, 2, 5, 0.1),
    )
    ranks = assign_ranks(MixedLayout("layers", groups, 36, 0.5))
    assert [(r.stage, r.num_stages, r.layers) for r in ranks] == [(0, 3, 19), (1, 3, 3), (2, 3, 2)]
    assert {r.samples for r in ranks} == {36}


def test_parse_plan_reads_the_planner_json(mixed_plan: dict) -> None:
    layout = parse_plan(mixed_plan)
    want_groups = mixed_plan["plans"][0]["groups"]
    assert [g.chip for g in layout.groups] == [g["chip"] for g in want_groups]
    assert [g.samples for g in layout.groups] == [g["batch_share"] for g in want_groups]
    assert (
        layout.global_batch == mixed_plan["global_batch"] == sum(g.samples for g in layout.groups)
    )


def test_parse_plan_names_the_missing_field() -> None:
    with pytest.raises(ArgosyError, match="'predicted'"):
        parse_plan({"global_batch": 8, "parallel": {}})
    with pytest.raises(ArgosyError, match="'plans' is empty"):
        parse_plan({"plans": []})


CHECKS = {
    "device count": ({"h100-sxm": 1, "a100-80g": 2}, 2, {"h100-sxm": 1, "a100-80g": 1}, "3 dev"),
    "chip type": ({"h100-sxm": 1, "a100-80g": 2}, 3, {"h100-sxm": 1, "910b": 2}, "a100-80g"),
    "split": ({"h100-sxm": 1, "a100-80g": 2}, 3, {"h100-sxm": 2, "a100-80g": 1}, "differs in"),
}


@pytest.mark.parametrize("plan,world,launch,want", CHECKS.values(), ids=CHECKS.keys())
def test_check_launch_names_the_mismatch(plan: dict, world: int, launch: dict, want: str) -> None:
    with pytest.raises(PlanMismatchError, match=want):
        check_launch(plan, world, launch, "p.json")


def test_emulated_speeds_follow_the_catalog_peaks() -> None:
    catalog = default_catalog()
    speeds = emulated_speeds(parse_chip_counts("h100:1,a100-80g:2"), catalog)
    want = catalog.get("h100").bf16_tflops / catalog.get("a100-80g").bf16_tflops
    assert [s.slowdown for s in speeds] == [4.0, 4.0 * want, 4.0 * want]
    assert canonical_counts([("h100", 1), ("h100-sxm", 1)], catalog) == {"h100-sxm": 2}
    with pytest.raises(ArgosyError, match="CHIP:N"):
        parse_chip_counts("h100")


def test_throttle_stretches_a_block_by_its_slowdown() -> None:
    throttle = Throttle(3.0)
    with throttle.block():
        sum(range(200_000))
    assert throttle.slept_s >= 2.0 * throttle.compute_s * 0.99
    assert throttle.cpu_s > 0
    with pytest.raises(ValueError, match="slowdown"):
        Throttle(0.5)


@pytest.fixture(scope="module")
def mixed_plan() -> dict:
    from typer.testing import CliRunner

    from argosy.cli.app import app

    args = ["plan", "-m", "gpt-1.7b", "-c", "h100:1+a100-80g:2", "--global-batch", "36"]
    result = CliRunner().invoke(app, [*args, "--seq-len", "2048", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)
