"""The console's incremental reader of a job's runtime event log (`RunLog`): whatever the
log holds and however its lines arrive (torn mid-line, many at once), the live goodput
from the digest is the runtime's own accounting over the whole log so far, and a new
launch (the old log archived, a new one started) starts the digest over."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.runtime.events import read_events
from argosy.runtime.goodput import summarize
from argosy.server.console.runlog import MAX_POINTS, RunLog, RunLogs


def synthetic_log(seed: int, attempts: int, steps: int, ckpt_every: int) -> list[dict[str, Any]]:
    """Events as `argosy launch` writes them: a start, then per attempt spawn, attached,
    resume (from one of the newest checkpoints of the attempt before), steps with
    checkpoints and commits logged a step or two late, and a fault with a restart."""
    rng = random.Random(seed)
    clock = [0]

    def at() -> float:
        clock[0] += rng.randint(1, 30)
        return clock[0] / 100  # on a 0.01 s grid: sums of durations round alike

    events: list[dict[str, Any]] = [{"event": "start", "t": 0.0}]
    resume_step, saved = 0, [0]
    for a in range(attempts):
        events += [{"event": "spawn", "t": at(), "attempt": a}]
        events += [{"event": "attached", "t": at(), "attempt": a}]
        events += [{"event": "resume", "t": at(), "attempt": a, "step": resume_step}]
        late: list[dict[str, Any]] = []
        for step in range(resume_step + 1, resume_step + 1 + rng.randint(0, steps)):
            events.append(
                {"event": "step", "t": at(), "attempt": a, "step": step, "loss": 1 / step}
            )
            if late and rng.random() < 0.5:
                events.append(late.pop(0))
            if step % ckpt_every == 0:
                saved.append(step)
                late.append(
                    {"event": "checkpoint", "t": clock[0] / 100, "attempt": a, "step": step}
                )
                late.append({"event": "commit", "t": clock[0] / 100, "attempt": a, "step": step})
        events += late
        if a < attempts - 1:
            detected = at()
            events.append(
                {
                    "event": "fault",
                    "t": detected,
                    "kind": "crash",
                    "rank": 0,
                    "attempt": a,
                    "action": "restart",
                    "detected_at_s": detected,
                    "detail": "rank 0 exited",
                }
            )
            events.append({"event": "restart", "t": at(), "attempt": a + 1, "reason": "crash"})
            resume_step = rng.choice(saved[-3:])
    events.append({"event": "end", "t": at(), "status": "completed"})
    return events


def write_in_pieces(path: Path, text: str, cuts: list[int], log: RunLog) -> None:
    """Append `text` to `path` cut at `cuts` (mid-line too), updating `log` after each."""
    done = 0
    for cut in [*sorted(cuts), len(text)]:
        with path.open("a") as f:
            f.write(text[done:cut])
        done = max(done, cut)
        log.update()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    attempts=st.integers(1, 4),
    steps=st.integers(0, 60),
    ckpt_every=st.integers(1, 7),
    cuts=st.lists(st.floats(0, 1), max_size=8),
)
def test_the_digest_accounts_as_the_whole_log_does(
    tmp_path_factory, seed, attempts, steps, ckpt_every, cuts
) -> None:
    path = tmp_path_factory.mktemp("run") / "events.jsonl"
    events = synthetic_log(seed, attempts, steps, ckpt_every)
    text = "".join(json.dumps(e) + "\n" for e in events)
    log = RunLog(path)
    write_in_pieces(path, text, [int(c * len(text)) for c in cuts], log)
    want = summarize(read_events(path))
    assert log.goodput() == want
    step_events = [e for e in events if e["event"] == "step"]
    assert log.last_step == (step_events[-1]["step"] if step_events else 0)
    assert len(log.curve) <= 2 * MAX_POINTS + 1


def test_a_torn_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "start", "t": 0.0}\n{"event": "spawn", "t": 0.1, "att')
    log = RunLog(path)
    log.update()
    assert [e["event"] for e in log.events] == ["start"]
    with path.open("a") as f:
        f.write('empt": 0}\n')
    log.update()
    assert [e["event"] for e in log.events] == ["start", "spawn"]


def test_a_new_launch_starts_the_digest_over(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = synthetic_log(1, 2, 30, 5)
    path.write_text("".join(json.dumps(e) + "\n" for e in first))
    logs = RunLogs()
    assert logs.get("j1", path).goodput() == summarize(first)
    second = [{"event": "start", "t": 0.0, "run_id": "second"}, *synthetic_log(2, 1, 5, 2)[1:]]
    path.rename(tmp_path / "archived.jsonl")  # what a relaunch does to the old log
    path.write_text("".join(json.dumps(e) + "\n" for e in second))
    assert logs.get("j1", path).goodput() == summarize(second)
    path.unlink()
    assert logs.get("j1", path).goodput() is None


def test_a_long_run_keeps_a_small_digest(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = synthetic_log(3, 3, 3000, 10)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    log = RunLog(path)
    log.update()
    kept_steps = [e for e in log.digest.kept() if e["event"] == "step"]
    assert len(kept_steps) <= 3 * (2 + 16)  # per attempt: first, last, newest anchors
    assert log.goodput() == summarize(events)
