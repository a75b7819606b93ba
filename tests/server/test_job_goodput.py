"""A job's goodput over its attempts (argosy.server.job_goodput): the figures of a job that
lost a node and resumed, and, over any attempts and any job-written figures, an account
whose parts add up to its wall time and stay within what the server's clock saw."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.cli.jobs import goodput_line
from argosy.executors.local import attempt_dir
from argosy.runtime.goodput import CAUSES
from argosy.server.job_goodput import (
    FIGURES_FILE,
    SERVER_CAUSES,
    account_figures,
    job_account,
    kept_figures,
)
from argosy.server.summaries import settle_summary, stamp_attempt


def kept(start: float, end: float, ended: str = "succeeded", **summary: Any) -> dict[str, Any]:
    """The figures the server keeps of an attempt with this span, summary and ending."""
    return account_figures({"span_s": [start, end], **summary}, ended)


def runtime(
    productive: float, wall: float, final: int, resumed: int, **more: Any
) -> dict[str, Any]:
    lost = dict.fromkeys(CAUSES, 0.0) | {"startup": wall - productive}
    return {
        "status": more.pop("status", "completed"),
        "productive_s": productive,
        "wall_s": wall,
        "final_step": final,
        "resumed_from": resumed,
        "lost_s": lost,
        "restarts": more.pop("restarts", 0),
        "faults": more.pop("faults", []),
    }


def test_a_job_that_lost_a_node_counts_the_lost_attempt_and_the_wait() -> None:
    # attempt 1: 50 s on the server's clock, reached step 30 at 1.5 s a step, lost its node;
    # 10 s waiting to be placed again; attempt 2 resumed from step 20 and finished step 40
    first = kept(1000.0, 1050.0, "lost", **runtime(45.0, 48.0, 30, 0, status="failed"))
    second = kept(1060.0, 1095.0, **runtime(30.0, 34.0, 40, 20))
    account = job_account([first, second])
    assert account is not None
    assert account["attempts"] == 2 and account["wall_s"] == 95.0
    assert account["lost_s"]["redone_after_loss"] == 15.0  # steps 21..30, done twice
    assert account["productive_s"] == 60.0  # 30 s of attempt 1 kept, 30 s of attempt 2
    assert account["lost_s"]["between_attempts"] == 10.0
    assert account["lost_s"]["outside_launcher"] == 3.0  # 2 s + 1 s the launchers missed
    assert account["effective_training_time"] == round(60 / 95, 4)
    assert account["restarts"] == 1 and account["faults"] == 1 and account["estimated"] == []


def test_an_attempt_without_a_summary_is_credited_the_steps_the_next_resumed_past() -> None:
    first = kept(0.0, 20.0, "lost", status="missing", detail="killed")  # its node went too
    second = kept(25.0, 55.0, **runtime(24.0, 27.0, 40, 10))
    account = job_account([first, second])
    assert account is not None
    assert account["productive_s"] == pytest.approx(8.0 + 24.0)  # 10 steps x 0.8 s + 24 s
    assert account["lost_s"]["outside_launcher"] == pytest.approx(12.0 + 3.0)
    assert account["estimated"] == [1] and account["faults"] == 1


@pytest.mark.parametrize("middle", [0, 1, 2])
def test_attempts_without_figures_between_two_hide_no_redone_steps(middle: int) -> None:
    """Attempt 1 reached step 125; attempts killed with their node before they logged
    anything came between; the last resumed from step 120. Steps 121..125 were done
    twice however many figureless attempts came between (each took a fault too)."""
    first = kept(0.0, 30.0, "lost", **runtime(25.0, 28.0, 125, 0))
    empty = [kept(30.0 + k, 30.5 + k, "lost", status="missing") for k in range(middle)]
    last = kept(40.0, 80.0, **runtime(36.0, 38.0, 300, 120))
    account = job_account([first, *empty, last])
    assert account is not None
    assert account["lost_s"]["redone_after_loss"] == pytest.approx(5 * 25.0 / 125)
    assert account["productive_s"] == pytest.approx(25.0 - 1.0 + 36.0)
    assert account["estimated"] == [2 + k for k in range(middle)]
    assert account["faults"] == 1 + middle


def test_steps_are_redone_from_the_earliest_step_a_later_attempt_resumed_from() -> None:
    """Attempt 3 resumed from before attempt 2's start (attempt 2's checkpoints unusable):
    what attempts 1 and 2 did past step 90 was all redone."""
    first = kept(0.0, 20.0, "lost", **runtime(20.0, 20.0, 100, 0))  # 0.2 s a step
    second = kept(20.0, 26.0, "lost", **runtime(6.0, 6.0, 130, 100))  # 0.2 s a step
    third = kept(26.0, 70.0, **runtime(44.0, 44.0, 310, 90))
    account = job_account([first, second, third])
    assert account is not None
    assert account["lost_s"]["redone_after_loss"] == pytest.approx(10 * 0.2 + 30 * 0.2)
    assert account["productive_s"] == pytest.approx(90 * 0.2 + 0.0 + 44.0)


STALL = {"kind": "hang", "rank": 0, "attempt": 0, "detail": "transport stall"}


@pytest.mark.parametrize(
    ("ended", "own_faults", "want"),
    [
        ("lost", [STALL], 1),  # the survivor recorded the peer's loss: one incident, once
        ("lost", [], 1),  # its launcher was killed with its node: the server's count
        ("failed", [STALL | {"action": "warn"}], 2),  # a warning, then a failure it missed
        ("stopped", [], 0),  # preempted or cancelled: no fault
    ],
)
def test_an_incident_counts_once_however_the_attempt_reported_it(ended, own_faults, want):
    first = kept(0.0, 10.0, ended, **runtime(5.0, 9.0, 10, 0, faults=own_faults))
    account = job_account([first])  # as soon as it ended: before any next attempt
    assert account is not None and account["faults"] == want
    assert account["restarts"] == 0  # not started again yet


def test_attempts_are_named_by_their_number_when_one_kept_no_figures() -> None:
    lost = kept(0.0, 20.0, "lost", status="missing")
    account = job_account([{}, lost, kept(25.0, 55.0, **runtime(24.0, 27.0, 40, 10))])
    assert account is not None
    assert account["attempts"] == 3 and account["estimated"] == [2]  # attempt 2, not 1


def test_one_attempt_is_its_runtime_figures_within_the_server_s_span() -> None:
    only = kept(0.0, 10.0, **runtime(7.0, 9.0, 70, 0))
    account = job_account([only])
    assert account is not None
    assert account["productive_s"] == 7.0 and account["wall_s"] == 10.0
    assert account["lost_s"]["startup"] == 2.0 and account["lost_s"]["outside_launcher"] == 1.0
    assert account["restarts"] == 0 and account["faults"] == 0


def test_argosy_job_prints_the_account_in_one_line() -> None:
    first = kept(0.0, 20.0, status="missing")
    account = job_account([first, kept(25.0, 55.0, **runtime(24.0, 27.0, 40, 10))])
    line = goodput_line(account or {})
    assert line.startswith("effective training time 58.2% over 2 attempt(s): wall 55.0 s")
    assert "between_attempts 5.0 s" in line and "redone_after_loss" not in line  # none lost
    assert (
        line.endswith("(none while no later attempt has resumed)")
        and "attempt 1 left neither a summary nor its event log" in line
    )


def test_no_span_no_account() -> None:
    assert job_account([]) is None
    assert job_account([{"productive_s": 5.0}, {"span_s": "yesterday"}]) is None


def test_the_kept_figures_carry_the_server_s_span_and_no_job_s_own(tmp_path: Path) -> None:
    stamp_attempt(tmp_path, 1)
    forged = runtime(5.0, 5.0, 5, 0) | {"span_s": [0, 1e9], "job": {"wall_s": 1}}
    forged["faults"] = [{"kind": "crash", "detail": "x" * 10}] * 1000  # 40 KB of faults
    (tmp_path / "summary.json").write_text(json.dumps(forged))
    settled = settle_summary(tmp_path, 1, "", span=(100.0, 110.0))
    assert settled["span_s"] == [100.0, 110.0] and "job" not in settled
    first, second = kept_figures(tmp_path, 2)  # attempt 2 kept nothing yet
    assert second == {} and first["span_s"] == [100.0, 110.0] and first["faults"] == 1000
    assert (attempt_dir(tmp_path, 1) / FIGURES_FILE).stat().st_size < 1024  # not the 40 KB
    assert first == account_figures(settled)


JOB_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.lists(st.integers(), max_size=2),
)
FIGURES = ("productive_s", "final_step", "resumed_from", "restarts", "status")


@st.composite
def attempts(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Back-to-back attempts (gaps between them) with honest, missing or hostile figures."""
    out, t = [], draw(st.floats(0, 1e6))
    for _ in range(draw(st.integers(1, 6))):
        t += draw(st.floats(0, 100))  # waiting to be placed
        span = draw(st.floats(0, 1000))
        kind = draw(st.sampled_from(["honest", "missing", "hostile"]))
        if kind == "honest":
            wall = draw(st.floats(0, span))
            productive = draw(st.floats(0, wall))
            steps = draw(st.integers(0, 1000))
            figures = runtime(productive, wall, steps + draw(st.integers(0, 500)), steps)
        elif kind == "missing":
            figures = {"status": "missing"}
        else:
            figures = {key: draw(JOB_VALUES) for key in FIGURES}
            figures["lost_s"] = draw(st.dictionaries(st.sampled_from(CAUSES), JOB_VALUES))
            figures["faults"] = draw(JOB_VALUES)
        ended = draw(st.sampled_from(["succeeded", "lost", "failed", "stopped", "odd"]))
        out.append(kept(t, t + span, ended, **figures))
        t += span
    return out


@settings(max_examples=300, deadline=None)
@given(attempts())
def test_the_account_adds_up_to_the_wall_and_stays_within_the_spans(kept_list) -> None:
    account = job_account(kept_list)
    assert account is not None
    spans = [k["span_s"][1] - k["span_s"][0] for k in kept_list]
    wall = kept_list[-1]["span_s"][1] - kept_list[0]["span_s"][0]
    assert account["wall_s"] == pytest.approx(wall, abs=1e-3)
    lost = account["lost_s"]
    assert set(lost) == {*CAUSES, *SERVER_CAUSES}
    assert all(math.isfinite(v) and v >= 0 for v in lost.values())
    assert account["productive_s"] + sum(lost.values()) == pytest.approx(wall, abs=0.02)
    assert 0 <= account["productive_s"] <= sum(spans) + 1e-3
    assert lost["between_attempts"] == pytest.approx(wall - sum(spans), abs=0.02)
    assert 0.0 <= account["effective_training_time"] <= 1.0
    assert account["attempts"] == len(kept_list)
    assert account["restarts"] >= len(kept_list) - 1
    ended_badly = sum(k["ended"] in ("lost", "failed") for k in kept_list)
    assert isinstance(account["faults"], int) and account["faults"] >= ended_badly
    json.dumps(account, allow_nan=False)  # strict JSON, whatever the job wrote
