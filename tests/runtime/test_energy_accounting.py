"""Energy accounting over hand-written event logs and traces: joules fall in goodput's buckets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.core.clock import FakeClock
from argosy.hardware.energy import DeviceTrace, Reading
from argosy.runtime.energy import energy_summary, read_trace, read_work
from argosy.runtime.goodput import CAUSES, summarize, time_buckets
from argosy.runtime.metering import RunMeter


def _steps(attempt: int, first: int, last: int, t0: float, dt: float) -> list[dict]:
    return [
        {
            "event": "step",
            "attempt": attempt,
            "step": s,
            "loss": 1.0,
            "t": t0 + (s - first + 1) * dt,
        }
        for s in range(first, last + 1)
    ]


def crash_run(dt: float, crash_after: int, resume_at: int, steps: int, gap: float) -> list[dict]:
    """Start 2 s, `crash_after` steps of `dt`, a crash `gap` s after the last step end,
    detected `gap` s later, restart 1.5 s, reload 1 s, resume at `resume_at`, finish."""
    end0 = 2.0 + crash_after * dt
    injected, detected = end0 + gap, end0 + 2 * gap
    attached, resumed = detected + 1.5, detected + 2.5
    return [
        {"event": "start", "t": 0.0},
        {"event": "spawn", "attempt": 0, "t": 0.0},
        {"event": "attached", "attempt": 0, "t": 1.0},
        {"event": "resume", "attempt": 0, "step": 0, "t": 2.0},
        *_steps(0, 1, crash_after, 2.0, dt),
        {
            "event": "fault",
            "attempt": 0,
            "kind": "crash",
            "rank": 0,
            "action": "restart",
            "injected_at_s": injected,
            "detected_at_s": detected,
            "t": detected,
        },
        {"event": "restart", "attempt": 1, "t": detected + 0.1},
        {"event": "spawn", "attempt": 1, "t": detected + 0.2},
        {"event": "attached", "attempt": 1, "t": attached},
        {"event": "resume", "attempt": 1, "step": resume_at, "t": resumed},
        *_steps(1, resume_at + 1, steps, resumed, dt),
        {"event": "end", "t": resumed + (steps - resume_at) * dt + 0.5},
    ]


def steady(watts: float, until_s: float, every_s: float = 0.25) -> DeviceTrace:
    """A counter trace of a device that draws `watts` from 0 to `until_s` (its last sample)."""
    trace = DeviceTrace("gpu0", "counter")
    times = [k * every_s for k in range(int(until_s / every_s) + 1)]
    for t in [*times, until_s]:
        trace.add(t, Reading(energy_j=watts * t))
    return trace


def test_buckets_add_up_to_the_goodput_figures() -> None:
    events = crash_run(dt=1.0, crash_after=12, resume_at=10, steps=20, gap=0.5)
    buckets, summary = time_buckets(events), summarize(events)
    seconds = {k: sum(b - a for a, b in v) for k, v in buckets.items()}
    assert seconds["productive"] == pytest.approx(summary["productive_s"])
    for cause in CAUSES[:-1]:
        assert seconds[cause] == pytest.approx(summary["lost_s"][cause], abs=1e-3)
    assert len(buckets["productive"]) == 20  # steps 1-10 of attempt 0, 11-20 of attempt 1


@settings(max_examples=40, deadline=None)
@given(
    watts=st.floats(1.0, 1000.0),
    dt=st.floats(0.05, 3.0),
    crash_after=st.integers(1, 15),
    back=st.integers(0, 5),
    gap=st.floats(0.01, 5.0),
)
def test_at_steady_power_joules_are_watts_times_the_goodput_seconds(
    watts: float, dt: float, crash_after: int, back: int, gap: float
) -> None:
    resume_at = max(0, crash_after - back)
    events = crash_run(dt, crash_after, resume_at, steps=crash_after + 5, gap=gap)
    summary = summarize(events)
    energy = energy_summary(events, {"gpu0": steady(watts, summary["wall_s"])})
    tol = watts * 2e-3 + 1e-6
    assert energy["productive_j"] == pytest.approx(watts * summary["productive_s"], abs=tol)
    for cause in CAUSES:
        want = watts * summary["lost_s"][cause]
        assert energy["lost_j"][cause] == pytest.approx(want, abs=tol * 4), cause
    assert energy["total_j"] == pytest.approx(
        energy["productive_j"] + sum(energy["lost_j"].values()),
        abs=0.004,  # 3-digit rounding
    )
    steps = crash_after + 5
    assert energy["joules_per_step"] == pytest.approx(
        energy["productive_j"] / steps,
        rel=1e-3,
        abs=5e-5 + 5e-4 / steps,  # its own 4-digit rounding, and productive_j's 3-digit
    )


def test_per_device_watts_and_work_per_joule() -> None:
    events = crash_run(dt=1.0, crash_after=4, resume_at=4, steps=8, gap=0.2)
    wall = summarize(events)["wall_s"]
    traces = {"gpu0": steady(300.0, wall), "gpu1": steady(100.0, wall)}
    energy = energy_summary(events, traces, {"tokens_per_step": 4096.0, "samples_per_step": 8})
    assert energy["measured"] is True
    assert energy["devices"]["gpu0"]["avg_w"] == pytest.approx(300.0)
    assert energy["devices"]["gpu1"]["peak_w"] == pytest.approx(100.0)
    want_tpj = 4096 * 8 / energy["total_j"]
    assert energy["tokens_per_joule"] == pytest.approx(want_tpj, rel=1e-4)
    assert energy["samples_per_joule"] == pytest.approx(8 * 8 / energy["total_j"], rel=1e-4)
    assert energy["joules_per_step_all_in"] == pytest.approx(energy["total_j"] / 8, rel=1e-4)


def test_no_meter_reads_says_not_measured_with_the_reasons() -> None:
    events = crash_run(dt=1.0, crash_after=3, resume_at=3, steps=4, gap=0.2)
    traces = {"gpu0": DeviceTrace("gpu0", "not measured")}
    energy = energy_summary(events, traces, {"tokens_per_step": 10}, {"rapl": "no powercap"})
    assert energy["measured"] is False
    assert "rapl: no powercap" in energy["reason"]
    assert "total_j" not in energy and "tokens_per_joule" not in energy
    assert energy["devices"]["gpu0"]["method"] == "not measured"


def test_trace_file_round_trip_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "energy.jsonl"
    lines = [
        {"devices": {"gpu0": "counter", "gpu1": "not measured"}, "unavailable": {"rapl": "x"}},
        {"t": 0.1, "d": {"gpu0": [0.0, 200.0]}},
        {"t": 1.1, "d": {"gpu0": [210.0, 220.0]}},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"t": 2.1, "d": {"gp')
    traces, unavailable = read_trace(path)
    assert unavailable == {"rapl": "x"}
    assert traces["gpu0"].total_j == 210.0 and traces["gpu0"].peak_w() == 220.0
    assert traces["gpu1"].total_j is None
    assert read_trace(tmp_path / "absent.jsonl")[1]["meter"].startswith("no absent.jsonl")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{"tokens_per_step": 512, "samples_per_step": null}', {"tokens_per_step": 512.0}),
        ('{"tokens_per_step": "many"}', {}),
        ("[1, 2]", {}),
        ("{not json", {}),
    ],
    ids=["tokens-only", "not-a-number", "not-a-dict", "garbled"],
)
def test_work_file_is_read_only_when_it_says_numbers(tmp_path: Path, text: str, want) -> None:
    (tmp_path / "work.json").write_text(text)
    assert read_work(tmp_path / "work.json") == want


def test_a_meter_turned_off_says_so(tmp_path: Path) -> None:
    meter = RunMeter(tmp_path, t0=0.0, clock=FakeClock(), interval_s=0.0)
    meter.start()
    meter.stop()
    energy = meter.summary([])
    assert energy["measured"] is False and "off (energy_interval_s=0)" in energy["reason"]
