"""Goodput accounting over a hand-written event log: each cause is the interval it names."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.runtime.goodput import summarize


def steps(attempt: int, first: int, last: int, t0: float, dt: float) -> list[dict]:
    return [
        {
            "event": "step",
            "attempt": attempt,
            "step": s,
            "loss": 10.0 / s,
            "t": t0 + (s - first + 1) * dt,
        }
        for s in range(first, last + 1)
    ]


def crash_then_resume() -> list[dict]:
    """Steps 1-12 at 1 s each; crash at 12.5 s, detected 13 s; resume from step 10."""
    events = [
        {"event": "start", "t": 0.0},
        {"event": "spawn", "attempt": 0, "t": 0.0},
        {"event": "attached", "attempt": 0, "t": 1.0},
        {"event": "resume", "attempt": 0, "step": 0, "t": 2.0},
        *steps(0, 1, 12, t0=2.0, dt=1.0),  # step 12 ends at 14.0
        {
            "event": "fault",
            "attempt": 0,
            "kind": "crash",
            "rank": 1,
            "action": "restart",
            "injected_at_s": 14.5,
            "detected_at_s": 15.0,
            "t": 15.0,
        },
        {"event": "restart", "attempt": 1, "reason": "crash", "t": 15.2},
        {"event": "spawn", "attempt": 1, "t": 15.5},
        {"event": "attached", "attempt": 1, "t": 17.0},
        {"event": "resume", "attempt": 1, "step": 10, "t": 18.0},
        *steps(1, 11, 20, t0=18.0, dt=1.0),  # step 20 ends at 28.0
        {"event": "end", "t": 28.5},
    ]
    return events


def test_each_cause_is_the_interval_it_names() -> None:
    summary = summarize(crash_then_resume())
    assert summary["final_step"] == 20
    assert summary["final_loss"] == pytest.approx(0.5)
    assert summary["wall_s"] == pytest.approx(28.5)
    assert summary["productive_s"] == pytest.approx(10 + 10)  # steps 1-10 and 11-20
    lost = summary["lost_s"]
    assert lost["startup"] == pytest.approx(2.0)
    assert lost["detection"] == pytest.approx(0.5)
    assert lost["restart"] == pytest.approx(2.0)
    assert lost["reload"] == pytest.approx(1.0)
    assert lost["redone"] == pytest.approx(2.0 + 0.5)  # steps 11-12, and the partial step
    assert lost["other"] == pytest.approx(0.5)
    assert summary["effective_training_time"] == pytest.approx(20 / 28.5, abs=1e-4)
    (fault,) = summary["faults"]
    assert fault["resumed_from_step"] == 10
    assert fault["detect_latency_s"] == pytest.approx(0.5)
    assert sum(fault["lost_s"].values()) == pytest.approx(0.5 + 2.0 + 1.0 + 2.5)
    assert summary["resumed_from"] == 0  # the run's first attempt started fresh


def test_a_run_launched_into_a_checkpoint_says_where_it_resumed() -> None:
    events = [e for e in crash_then_resume() if e.get("attempt") != 0]
    summary = summarize([{"event": "start", "t": 0.0}, *events])
    assert summary["resumed_from"] == 10 and summary["final_step"] == 20


def test_warnings_are_listed_but_cost_no_restart() -> None:
    events = crash_then_resume()
    events.insert(
        8,
        {
            "event": "fault",
            "attempt": 0,
            "kind": "straggler",
            "rank": 0,
            "action": "warn",
            "injected_at_s": 3.0,
            "detected_at_s": 6.0,
            "slowdown": 2.0,
            "t": 6.0,
        },
    )
    summary = summarize(events)
    kinds = [f["kind"] for f in summary["faults"]]
    assert kinds == ["straggler", "crash"]
    assert summary["faults"][0]["detect_latency_s"] == pytest.approx(3.0)
    assert summary["restarts"] == 1


def test_an_empty_log_summarizes_to_nothing_lost() -> None:
    summary = summarize([{"event": "start", "t": 0.0}])
    assert summary["final_step"] == 0 and summary["faults"] == []
    assert summary["effective_training_time"] == 0.0
    assert summary["resumed_from"] is None


def agent_log(budget: int, faults: int) -> list[dict]:
    """The log the agent writes when `faults` attempts in a row fail under `budget` restarts:
    each failed attempt's fault is a restart, except the one that spends the budget."""
    events: list[dict] = [{"event": "start", "t": 0.0}]
    t = 0.0
    attempts = min(faults, budget) + 1
    for a in range(attempts):
        events.append({"event": "spawn", "attempt": a, "t": t})
        failed = a < faults
        if failed:
            action = "give_up" if a == budget else "restart"
            fault = {"event": "fault", "attempt": a, "kind": "exit", "rank": 0, "action": action}
            events.append(fault | {"detected_at_s": t + 0.5, "t": t + 0.5})
            if action == "restart":
                events.append(
                    {"event": "restart", "attempt": a + 1, "reason": "exit", "t": t + 0.6}
                )
            else:
                events.append({"event": "give_up", "attempt": a, "restarts": a, "t": t + 0.6})
        t += 1.0
    events.append({"event": "end", "t": t})
    return events


@given(budget=st.integers(0, 6), faults=st.integers(0, 9))
def test_restarts_count_the_restarts_the_log_records(budget: int, faults: int) -> None:
    events = agent_log(budget, faults)
    summary = summarize(events)
    want_restarts = sum(1 for e in events if e["event"] == "restart")
    assert summary["restarts"] == want_restarts == min(faults, budget)
    assert summary["attempts"] == want_restarts + 1
    stopped = [f for f in summary["faults"] if f.get("action") != "warn"]
    assert len(stopped) == min(faults, budget + 1)  # the give-up fault is listed, not counted
