"""The job page written out directly (`job_json` over raw JSON columns) says exactly what
the pydantic view says, for any job the store can hold."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.server.spec import JobSpec
from argosy.server.store import Store
from argosy.server.views import job_json, job_view

text = st.text(max_size=20)
summaries = st.none() | st.dictionaries(st.sampled_from(["status", "cause", "x"]), text)
placements = st.none() | st.fixed_dictionaries(
    {
        "chip": st.sampled_from(["cpu", "h100-sxm"]),
        "nodes": st.dictionaries(text, st.integers(1, 8)),
    }
)
updates = st.fixed_dictionaries(
    {
        "state": st.sampled_from(["pending", "running", "failed", "succeeded"]),
        "attempts": st.integers(0, 5),
        "reason": text,
        "exit_code": st.none() | st.integers(0, 255),
        "started_at": st.none() | st.floats(1e9, 2e9),
        "finished_at": st.none() | st.floats(1e9, 2e9),
        "placement": placements,
        "summary": summaries,
    }
)


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    with tempfile.TemporaryDirectory() as tmp:
        s = Store(f"sqlite:///{Path(tmp) / 'a.db'}")
        yield s
        s.close()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.from_regex(r"[a-z][a-z0-9._-]{0,10}", fullmatch=True),
    args=st.lists(text, max_size=3),
    values=updates,
)
def test_the_direct_page_matches_the_pydantic_view(
    store: Store, name: str, args: list, values: dict
) -> None:
    spec = JobSpec(name=name, script="/bin/true", args=args).model_dump()
    row, _ = store.insert_job(spec, now=time.time())
    store.update_job(row["id"], values)
    (decoded,), _ = store.list_jobs(cursor=row["seq"] - 1, limit=1)
    (raw,), _ = store.list_jobs(cursor=row["seq"] - 1, limit=1, raw_json=True)
    assert raw["spec"] != decoded["spec"]  # text, not yet decoded
    assert json.loads(job_json(raw)) == json.loads(job_view(decoded).model_dump_json())


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(st.sampled_from(["insert", "run", "fail", "count"]), max_size=12))
def test_cached_counts_always_equal_a_fresh_count(store: Store, steps: list[str]) -> None:
    from sqlalchemy import func, select

    from argosy.server.tables import jobs

    ids: list[str] = []
    for step in steps:
        if step == "insert" or not ids:
            spec = JobSpec(name="c", script="/bin/true").model_dump()
            ids.append(store.insert_job(spec, now=time.time())[0]["id"])
        elif step in ("run", "fail"):
            store.update_job(ids[-1], {"state": "running" if step == "run" else "failed"})
        query = select(jobs.c.queue, jobs.c.state, func.count()).group_by(
            jobs.c.queue, jobs.c.state
        )
        with store.engine.connect() as c:
            want = {(q, s): n for q, s, n in c.execute(query)}
        assert store.count_jobs() == want


def test_the_latest_rank_log_is_the_highest_attempt_number(tmp_path) -> None:
    from argosy.server.views import latest_rank_log

    assert latest_rank_log(tmp_path, 0) is None
    for n in (1, 2, 9, 10):
        d = tmp_path / "logs" / f"attempt{n}"
        d.mkdir(parents=True)
        (d / "rank0.log").write_text(str(n))
    (tmp_path / "logs" / "attempt9" / "rank1.log").write_text("9")
    assert latest_rank_log(tmp_path, 0).parent.name == "attempt10"
    assert latest_rank_log(tmp_path, 1).parent.name == "attempt9"


def test_the_latest_rank_log_is_found_without_following_links(tmp_path: Path) -> None:
    """attempt10 is newer than attempt9; an attempt directory the job made a link to
    somewhere else is not looked into."""
    from argosy.server.views import latest_rank_log

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    for attempt in ("attempt9", "attempt10"):
        (run / "logs" / attempt).mkdir(parents=True)
        (run / "logs" / attempt / "rank0.log").write_text(attempt)
    (elsewhere).mkdir()
    (elsewhere / "rank0.log").write_text("secret")
    (run / "logs" / "attempt11").symlink_to(elsewhere)
    assert latest_rank_log(run, 0) == run / "logs" / "attempt10" / "rank0.log"
    assert latest_rank_log(run, 1) is None
