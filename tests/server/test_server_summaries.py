"""Per-attempt summaries: a job never shows an earlier attempt's summary.json, nor the
"running" placeholder of a launcher that was killed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from argosy.server.summaries import settle_summary, stamp_attempt

FINAL = {"status": "completed", "wall_s": 3.0, "effective_training_time": 0.9}


def write_summary(run_dir: Path, data: dict, mtime_ns: int | None = None) -> None:
    path = run_dir / "summary.json"
    path.write_text(json.dumps(data))
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.mark.parametrize(
    ("written", "want_status"),
    [
        ("before-the-stamp", "missing"),  # killed before `argosy launch` archived it
        ("placeholder", "missing"),  # killed mid-run: {"status": "running"}
        ("none", "missing"),
        ("after-the-stamp", "completed"),
    ],
)
def test_only_a_final_summary_written_during_the_attempt_counts(
    tmp_path: Path, written: str, want_status: str
) -> None:
    if written == "before-the-stamp":
        write_summary(tmp_path, FINAL)
    stamp_attempt(tmp_path, 2)
    stamp_ns = (tmp_path / "server" / "attempt2" / "started").stat().st_mtime_ns
    if written == "before-the-stamp":
        os.utime(tmp_path / "summary.json", ns=(stamp_ns - 10**9, stamp_ns - 10**9))
    elif written == "placeholder":
        write_summary(tmp_path, {"status": "running"}, stamp_ns + 10**6)
    elif written == "after-the-stamp":
        write_summary(tmp_path, FINAL, stamp_ns + 10**6)
    got = settle_summary(tmp_path, 2, "the launcher was killed by SIGKILL (exit 137)")
    assert got["status"] == want_status and got["attempt"] == 2
    if want_status == "missing":
        assert "attempt 2" in got["detail"] and "SIGKILL" in got["detail"]
    else:
        assert got == FINAL | {"attempt": 2}
    kept = json.loads((tmp_path / "server" / "attempt2" / "summary.json").read_text())
    assert kept == got


def write_events(run_dir: Path, events: list[dict], mtime_ns: int) -> None:
    path = run_dir / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    os.utime(path, ns=(mtime_ns, mtime_ns))


RUN = [{"event": "spawn", "t": 0.5, "attempt": 0}] + [
    {"event": "step", "t": 1.0 + 0.1 * k, "attempt": 0, "step": k + 1, "loss": 2.0}
    for k in range(5)
]
"""What a launcher killed at its fifth step logged: a spawn and five steps 0.1 s apart."""


@pytest.mark.parametrize(
    ("events", "when", "figures"),
    [
        (RUN, "after", True),
        (RUN, "before", False),  # the previous attempt's log: never this one's figures
        ([*RUN, {"event": "step", "t": "late", "attempt": 0, "step": 6}], "after", False),
        ([{"event": "step", "t": 1.0}], "after", False),  # not the runtime's events
        ([], "after", False),
    ],
)
def test_a_killed_launcher_s_figures_come_from_its_own_event_log(
    tmp_path: Path, events: list[dict], when: str, figures: bool
) -> None:
    stamp_attempt(tmp_path, 2)
    stamp_ns = (tmp_path / "server" / "attempt2" / "started").stat().st_mtime_ns
    write_events(tmp_path, events, stamp_ns + (10**6 if when == "after" else -(10**9)))
    write_summary(tmp_path, {"status": "running"}, stamp_ns + 10**6)
    got = settle_summary(tmp_path, 2, "the launcher was killed by SIGKILL (exit 137)")
    assert got["status"] == "missing" and "SIGKILL" in got["detail"]
    if not figures:
        assert "productive_s" not in got and "from_events" not in got, got
        return
    assert got["from_events"] and "event log" in got["detail"]
    assert got["final_step"] == 5 and got["productive_s"] == pytest.approx(0.4)
    assert got["wall_s"] == pytest.approx(1.4) and got["resumed_from"] is None
    figures_kept = json.loads((tmp_path / "server" / "attempt2" / "account.json").read_text())
    assert figures_kept["productive_s"] == pytest.approx(0.4)


def test_an_event_log_past_the_limit_gives_no_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read whole or not at all: a prefix would understate what the attempt did."""
    import argosy.server.summaries as summaries

    stamp_attempt(tmp_path, 1)
    stamp_ns = (tmp_path / "server" / "attempt1" / "started").stat().st_mtime_ns
    write_events(tmp_path, RUN, stamp_ns + 10**6)
    monkeypatch.setattr(summaries, "SUMMARY_LIMIT_BYTES", 100)
    got = settle_summary(tmp_path, 1, "lost")
    assert got["status"] == "missing" and "productive_s" not in got


def test_the_goodput_gauge_averages_finished_jobs_with_a_figure_only(tmp_path: Path) -> None:
    import time

    from argosy.server.spec import JobSpec
    from argosy.server.store import Store

    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    assert store.mean_effective_training_time() is None
    finished = [
        ("succeeded", {"effective_training_time": 0.8}),
        ("failed", {"effective_training_time": 0.4}),
        ("failed", {"status": "missing", "attempt": 1}),  # no figure: left out
        ("running", {"effective_training_time": 0.0}),  # not finished: left out
    ]
    for state, summary in finished:
        row, _ = store.insert_job(JobSpec(name="a", script="x").model_dump(), now=time.time())
        store.update_job(row["id"], {"state": state, "summary": summary})
    assert store.mean_effective_training_time() == pytest.approx(0.6)
    store.close()


def test_a_gang_summary_has_a_row_per_node_rank(tmp_path: Path) -> None:
    stamp_attempt(tmp_path, 1)
    stamp_ns = (tmp_path / "server" / "attempt1" / "started").stat().st_mtime_ns
    rank0 = FINAL | {"lost_s": {"startup": 1.0, "redone": 0.5}, "faults": [{}], "restarts": 1}
    write_summary(tmp_path, rank0, stamp_ns + 10**6)
    (tmp_path / "node1").mkdir()
    write_summary(tmp_path / "node1", {"status": "running"}, stamp_ns + 10**6)
    got = settle_summary(tmp_path, 1, "node rank 1's Ray node died", nodes=["a", "b"])
    rows = got["nodes"]
    assert [(r["node_rank"], r["node"]) for r in rows] == [(0, "a"), (1, "b")]
    assert rows[0]["status"] == FINAL["status"] and rows[0]["lost_s"] == 1.5
    assert rows[0]["faults"] == 1 and rows[0]["restarts"] == 1
    assert rows[1]["status"] == "missing" and rows[1]["lost_s"] is None
    alone = settle_summary(tmp_path, 1, "", nodes=["a"])
    assert "nodes" not in alone
