"""The console's pure parts: why a pending job waits, the allocation series over a real
SQLite store, and simulator reports (validation and crash-safe saving)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.server.console.overview import wait_reason
from argosy.server.console.reads import allocation_series, ready_replicas
from argosy.server.console.simreports import ReportError, list_reports, load_report, save_report
from argosy.server.schemas import QueueInfo
from argosy.server.store import Store


def queue(ceiling: int, usage: int) -> QueueInfo:
    return QueueInfo(
        name="a",
        parent="org",
        leaf=True,
        weight=1.0,
        guarantee={},
        nominal={"cpu": ceiling},
        ceiling={"cpu": ceiling},
        usage={"cpu": usage},
        pending=1,
        running=0,
    )


@pytest.mark.parametrize(
    ("ranks", "reason", "q", "free", "want"),
    [
        (4, "", queue(8, 6), {"cpu": 8}, "queue 'a' at its ceiling: needs 4, room for 2"),
        (4, "", queue(8, 0), {"cpu": 2}, "needs 4 devices; 2 free"),
        (2, "", queue(8, 0), {"cpu": 8}, "fits now"),
        (2, "preempted", queue(8, 0), {"cpu": 8}, "preempted; fits now"),
    ],
    ids=["ceiling", "no-free-devices", "fits", "keeps-stored-reason"],
)
def test_wait_reason(ranks, reason, q, free, want) -> None:
    row = {"spec": {"nproc_per_node": ranks, "nnodes": 1}, "reason": reason}
    assert want in wait_reason(row, q, free)


spans = st.lists(
    st.tuples(st.floats(0, 1000), st.floats(0, 1000), st.integers(1, 8), st.floats(0, 1)),
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(spans=spans)
def test_the_series_holds_each_jobs_device_seconds_inside_the_window(tmp_path_factory, spans):
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('db')}/s.db")
    now, window, buckets = 1000.0, 600.0, 30
    want_alloc = want_useful = 0.0
    for begin, length, ranks, ett in spans:
        end = min(begin + length, now)
        spec = {"name": "j", "queue": "a", "nproc_per_node": ranks, "nnodes": 1}
        row, _ = store.insert_job(spec, now=0)
        summary = {"effective_training_time": ett}
        store.update_job(row["id"], {"started_at": begin, "finished_at": end, "summary": summary})
        held = max(0.0, end - max(begin, now - window)) * ranks
        want_alloc += held
        want_useful += held * ett
    s = allocation_series(store, now, window, buckets)
    store.close()
    step = window / buckets
    assert sum(s.allocated) * step == pytest.approx(want_alloc, abs=1e-6)
    assert sum(s.useful) * step == pytest.approx(want_useful, abs=1e-6)
    assert all(u <= a + 1e-9 for u, a in zip(s.useful, s.allocated, strict=True))


REPORT = {
    "runs": [
        {"policy": "fifo", "five_factor": {"product": {"value": 0.1}}, "jct_s": {}},
        {"policy": "argosy", "five_factor": {"product": {"value": 0.3}}, "jct_s": {}},
    ],
    "ratios": {"argosy / fifo": 3.0},
}


def test_a_saved_report_is_listed_and_charted(tmp_path: Path) -> None:
    save_report(tmp_path, "month.json", json.dumps(REPORT).encode())
    assert list_reports(tmp_path) == ["month.json"]
    report = load_report(tmp_path, "month.json")
    chart = report.chart_data()
    assert chart["policies"] == ["fifo", "argosy"]
    assert chart["factors"] == [{"name": "product", "values": [0.1, 0.3]}]


@pytest.mark.parametrize(
    ("name", "body", "want"),
    [
        ("x.json", b"{", "not JSON"),
        ("x.json", b'{"runs": []}', "non-empty list"),
        ("x.json", b'{"runs": [{"five_factor": {}}]}', "'policy'"),
        ("x.json", b'{"runs": [{"policy": "fifo"}]}', "missing 'five_factor'"),
        ("x.json", json.dumps(REPORT | {"ratios": {"a": "x"}}).encode(), "map names to numbers"),
        ("../x.json", json.dumps(REPORT).encode(), "use letters"),
        ("x.txt", json.dumps(REPORT).encode(), "end in .json"),
    ],
    ids=["not-json", "no-runs", "no-policy", "no-factors", "bad-ratio", "path", "suffix"],
)
def test_a_bad_report_is_refused_and_leaves_no_file(tmp_path: Path, name, body, want) -> None:
    with pytest.raises(ReportError, match=want.replace("(", r"\(")):
        save_report(tmp_path, name, body)
    assert os.listdir(tmp_path) == []


def test_a_failed_write_leaves_the_old_report_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_report(tmp_path, "a.json", json.dumps(REPORT).encode())

    def disk_full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the write fails after some bytes went out
    newer = dict(REPORT, runs=[{"policy": "x", "five_factor": {}}])
    with pytest.raises(OSError, match="No space"):
        save_report(tmp_path, "a.json", json.dumps(newer).encode())
    assert load_report(tmp_path, "a.json").runs[0]["policy"] == "fifo"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_ready_replicas_replay_the_replica_events(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/s.db")
    svc = store.insert_service({"name": "chat", "queue": "a"}, now=time.time())["id"]
    other = store.insert_service({"name": "idle", "queue": "a"}, now=time.time())["id"]
    story = [
        ("replica_started", "replica 0 on n0 port 1"),
        ("replica_ready", "replica 0 healthy"),
        ("replica_started", "replica 1 on n1 port 2"),
        ("replica_ready", "replica 1 healthy"),
        ("replica_ready", "replica 1 healthy"),  # no change: already counted
        ("replica_unhealthy", "replica 1 failed 3 health probes in a row; restarting it"),
        ("replica_exited", "replica 1 attempt 1: killed; restarting"),
        ("replica_started", "replica 1 on n1 port 2"),
    ]
    for kind, message in story:
        store.add_event(svc, kind, message)
    series = ready_replicas(store, [svc, other], time.time() + 1, 3600.0)
    store.close()
    times, counts = series[svc]
    assert counts == [0, 1, 2, 1, 1]  # window start, three changes, now
    assert times == sorted(times)
    assert series[other][1] == [0, 0]
