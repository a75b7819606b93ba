"""Plan -> rank assignments (pure), sample weights, and the plan/launch checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.core.clock import FakeClock
from argosy.core.errors import ArgosyError
from argosy.hardware.catalog import default_catalog
from argosy.runtime.mixed.emulate import (
    Throttle,
    canonical_counts,
    parse_sample_seconds,
    relative_speeds,
    sample_seconds,
)
from argosy.runtime.mixed.launching import ASSIGNMENT_FILE, prepare
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
    speeds = relative_speeds(parse_chip_counts("h100:1,a100-80g:2"), catalog)
    want = catalog.get("a100-80g").bf16_tflops / catalog.get("h100").bf16_tflops
    assert [s.relative_speed for s in speeds] == [1.0, want, want]
    assert sample_seconds(0.01, ["h100-sxm", "a100-80g"], [1.0, want]) == {
        "h100-sxm": 0.01,
        "a100-80g": pytest.approx(0.01 / want),
    }
    assert canonical_counts([("h100", 1), ("h100-sxm", 1)], catalog) == {"h100-sxm": 2}
    with pytest.raises(ArgosyError, match="CHIP:N"):
        parse_chip_counts("h100")


SAMPLE_S = {
    "two chips": ("h100-sxm=0.01, a100-80g=0.03", {"h100-sxm": 0.01, "a100-80g": 0.03}),
    "no seconds": ("h100-sxm", "'h100-sxm': expected CHIP=SECONDS"),
    "zero": ("h100-sxm=0", "SECONDS > 0"),
    "empty": (" , ", "empty"),
}


@pytest.mark.parametrize("text,want", SAMPLE_S.values(), ids=SAMPLE_S.keys())
def test_parse_sample_seconds(text: str, want: dict | str) -> None:
    if isinstance(want, dict):
        assert parse_sample_seconds(text) == want
        return
    with pytest.raises(ValueError, match=want):
        parse_sample_seconds(text)


def _fake_throttle(sample_s: float) -> tuple[Throttle, FakeClock]:
    clock = FakeClock()
    return Throttle(sample_s, clock=clock, sleep=clock.advance), clock


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4), st.floats(0.0, 0.05)), min_size=1, max_size=5),
    st.sampled_from([0.0, 0.004, 0.01]),
)
def test_a_step_lasts_its_samples_times_sample_s_plus_the_counted_overrun(
    blocks: list[tuple[int, float]], sample_s: float
) -> None:
    """Deadline-based: a step takes sum(samples) x sample_s whatever each block's real
    compute took, unless the compute ran past the last deadline; that excess is the
    counted overrun. An early block's overrun is caught up by later blocks."""
    throttle, clock = _fake_throttle(sample_s)
    with throttle.step():
        for samples, compute_s in blocks:
            with throttle.block(samples):
                clock.advance(compute_s)
    want = sum(samples for samples, _ in blocks) * sample_s
    assert throttle.emulated_s == pytest.approx(want)
    assert clock.now_s() == pytest.approx(want + throttle.overrun_s)
    want_end = 0.0  # the emulated timeline: a block starts at the previous deadline
    finish = 0.0
    for samples, compute_s in blocks:
        finish = max(finish, want_end) + compute_s
        want_end += samples * sample_s
        finish = max(finish, want_end)
    assert throttle.overrun_s == pytest.approx(max(0.0, finish - want_end), abs=1e-12)
    assert throttle.compute_s == pytest.approx(sum(c for _, c in blocks))


def test_outside_a_step_each_block_counts_its_own_overrun() -> None:
    throttle, clock = _fake_throttle(0.01)
    with throttle.block(1):
        clock.advance(0.015)
    with throttle.block(2):
        clock.advance(0.001)
    assert throttle.overrun_s == pytest.approx(0.005)
    assert clock.now_s() == pytest.approx(0.015 + 0.02)
    with pytest.raises(ValueError, match="sample_s"):
        Throttle(-1.0)


def test_pace_waits_for_the_emulated_backward() -> None:
    throttle, clock = _fake_throttle(0.03)
    throttle.pace(1.0)  # outside a block: no wait
    assert clock.now_s() == 0.0
    with throttle.block(1):
        throttle.pace(0.5)  # forward third + half the backward = 2/3 of 30 ms
        assert clock.now_s() == pytest.approx(0.02)
    assert clock.now_s() == pytest.approx(0.03)


def test_the_real_clock_never_ends_a_block_before_its_deadline() -> None:
    throttle = Throttle(0.002)
    start = time.monotonic()
    with throttle.step():
        for _ in range(3):
            with throttle.block(2):
                pass
    assert time.monotonic() - start >= 0.012


@pytest.fixture(scope="module")
def mixed_plan() -> dict:
    from typer.testing import CliRunner

    from argosy.cli.app import app

    args = ["plan", "-m", "gpt-1.7b", "-c", "h100:1+a100-80g:2", "--global-batch", "36"]
    result = CliRunner().invoke(app, [*args, "--seq-len", "2048", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


EMULATION_ENV = {
    "peak, calibrated": ({}, None),
    "plan speeds": ({"ARGOSY_EMULATE_SPEED": "plan"}, None),
    "given times": ({"ARGOSY_EMULATE_SAMPLE_S": "h100=0.01,a100-80g=0.02"}, None),
    "unknown source": ({"ARGOSY_EMULATE_SPEED": "tflops"}, "expected one of peak, plan"),
    "a chip without a time": ({"ARGOSY_EMULATE_SAMPLE_S": "h100=0.01"}, "no time for a100-80g"),
    "an unknown chip": ({"ARGOSY_EMULATE_SAMPLE_S": "h100=0.01,zz9=1"}, "zz9"),
}


@pytest.mark.parametrize("env,error", EMULATION_ENV.values(), ids=EMULATION_ENV.keys())
def test_launch_records_the_emulation_or_names_the_bad_setting(
    mixed_plan: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict, error: str | None
) -> None:
    for name in ("ARGOSY_EMULATE_SPEED", "ARGOSY_EMULATE_SAMPLE_S", "ARGOSY_EMULATE_HEADROOM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(mixed_plan))
    if error is not None:
        with pytest.raises(ArgosyError, match=error):
            prepare(plan, "h100:1,a100-80g:2", 3, tmp_path)
        return
    prepare(plan, "h100:1,a100-80g:2", 3, tmp_path)
    emulation = json.loads((tmp_path / ASSIGNMENT_FILE).read_text())["emulation"]
    assert "EMULATED" in emulation["note"]
    speeds = emulation["relative_speed"]
    assert speeds[0] == 1.0 and speeds[1] == speeds[2] < 1.0
    groups = mixed_plan["plans"][0]["groups"]
    given = "ARGOSY_EMULATE_SAMPLE_S" in env
    if given:  # the given times set the speeds, and the note says so
        assert speeds[1] == pytest.approx(0.5) and "given per-chip times" in emulation["note"]
    elif env.get("ARGOSY_EMULATE_SPEED") == "plan":
        rates = [g["batch_share"] / g["step_time_s"] / g["devices"] for g in groups]
        assert speeds[1] == pytest.approx(rates[1] / rates[0])
    else:
        assert speeds[1] == pytest.approx(312 / 989, rel=1e-3)
    want_times = {"h100-sxm": 0.01, "a100-80g": 0.02} if given else None
    assert emulation["sample_s"] == want_times


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(0, 40)), min_size=1, max_size=4),
    st.integers(0, 30),
)
def test_every_batch_split_rank_gets_a_sequence(groups: list, spare: int) -> None:
    """A plan whose group has fewer sequences than ranks still runs: each rank gets one,
    taken from the groups with the most per device, and the batch is kept."""
    devices = sum(d for d, _ in groups)
    shares = [s for _, s in groups]
    batch = max(sum(shares), devices) + spare
    shares[0] += batch - sum(shares)
    entry = {
        "split": "batch",
        "predicted": {"step_time_s": 1.0},
        "parallel": {},
        "groups": [
            {"chip": f"c{i}", "devices": d, "batch_share": s, "parallel": {"mbs": 2, "pp": 2}}
            for i, ((d, _), s) in enumerate(zip(groups, shares, strict=True))
        ],
    }
    layout = parse_plan({"plans": [entry], "global_batch": batch})
    ranks = assign_ranks(layout)
    assert all(r.samples >= 1 for r in ranks) and sum(r.samples for r in ranks) == batch
    for g, planned in zip(layout.groups, shares, strict=True):
        assert g.samples >= g.devices  # none starved
        assert g.samples <= max(planned, g.devices)  # only starved groups gain


def test_the_planners_tiny_mixed_plan_assigns_a_sequence_to_every_rank() -> None:
    """The plan of issue 33: A100 group pp2 with a batch share of 1 on 2 devices."""
    from argosy.hardware.loader import load_cluster
    from argosy.planner.api import plan
    from argosy.planner.models import load_model

    model = load_model("layers=2,hidden=128,heads=4,vocab=512")
    result = plan(model, load_cluster("h100:1+a100-80g:2"), 128, 12)
    ranks = assign_ranks(parse_plan(json.loads(json.dumps(result, default=str))))
    assert len(ranks) == 3 and min(r.samples for r in ranks) >= 1
    assert sum(r.samples for r in ranks) == 12


def test_a_batch_smaller_than_the_ranks_is_refused_with_the_fix() -> None:
    entry = {"predicted": {"step_time_s": 1.0}, "parallel": {"mbs": 1}}
    with pytest.raises(PlanMismatchError, match="--global-batch 8"):
        parse_plan({"plans": [entry], "global_batch": 4, "cluster": "h100-sxm:8"})


@settings(max_examples=30, deadline=None)
@given(
    h100=st.sampled_from([1, 2, 4]),
    a100=st.sampled_from([1, 2, 4]),
    layers=st.integers(2, 8),
    batch=st.integers(1, 12),
)
def test_every_plan_the_planner_prints_is_one_the_launch_runs(h100, a100, layers, batch) -> None:
    """Each printed mixed plan passes the launch's checks and gives every batch-split
    rank at least one sequence; a batch too small for that gets layer splits only."""
    from argosy.hardware.loader import load_cluster
    from argosy.planner.api import plan
    from argosy.planner.models import load_model

    model = load_model(f"layers={layers},hidden=128,heads=4,vocab=512")
    cluster = load_cluster(f"h100:{h100}+a100-80g:{a100}")
    result = plan(model, cluster, 128, batch, top=3)
    launch = {"h100-sxm": h100, "a100-80g": a100}
    if batch < h100 + a100:
        assert "batch_split" in result
    for entry in result["plans"]:
        if batch < h100 + a100:
            assert entry["split"] == "layers"
        layout = parse_plan({**entry, "global_batch": batch})
        check_launch(layout.chip_counts(), h100 + a100, launch, "printed")
        ranks = assign_ranks(layout)
        assert len(ranks) == h100 + a100
        if layout.split == "layers":
            assert sum(r.layers or 0 for r in ranks) == layers
        else:
            assert min(r.samples for r in ranks) >= 1
            assert sum(r.samples for r in ranks) == batch
