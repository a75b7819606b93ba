"""Job files parsed ahead in a worker thread: the loop gets the parse of the file as it is
when it reads, never a stale one, and nothing read ahead piles up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import argosy.server.read_ahead as ahead
from argosy.server.summaries import read_exit_ahead, settle_summary, stamp_attempt

LIMIT = 1 << 20


@pytest.fixture(autouse=True)
def _nothing_waiting() -> None:
    ahead._ahead.clear()  # what other tests (or a server in this process) read ahead


def _count(calls: list[str]):  # noqa: ANN202
    def parse(text: str | None) -> str | None:
        calls.append(text or "")
        return text

    return parse


def test_a_parse_read_ahead_is_used_once_and_only_while_the_file_is_unchanged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "summary.json"
    path.write_text("first")
    calls: list[str] = []
    parse = _count(calls)
    assert ahead.read_ahead(path, parse, LIMIT) == "first"
    assert ahead.parsed(path, parse, LIMIT) == "first" and calls == ["first"]  # no re-read
    assert ahead.parsed(path, parse, LIMIT) == "first" and len(calls) == 2  # used once
    ahead.read_ahead(path, parse, LIMIT)
    path.write_text("second, longer")  # the job rewrote it since
    assert ahead.parsed(path, parse, LIMIT) == "second, longer"


def test_a_file_past_the_limit_is_not_read_ahead(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("x" * 100)
    calls: list[str] = []
    assert ahead.read_ahead(path, _count(calls), 10) is None and calls == []


def test_at_most_keep_parses_wait(tmp_path: Path) -> None:
    for k in range(ahead.KEEP + 3):
        (tmp_path / f"f{k}").write_text(str(k))
        ahead.read_ahead(tmp_path / f"f{k}", _count([]), LIMIT)
    assert len(ahead._ahead) <= ahead.KEEP


@pytest.mark.parametrize("final", [True, False])
def test_an_exit_settled_after_its_read_ahead_is_the_same_as_without(
    tmp_path: Path, final: bool
) -> None:
    """The kept summary is identical whether the files were parsed ahead or not; a
    launcher that died has its event log read ahead too."""
    runs = {}
    for name in ("ahead", "inline"):
        run = tmp_path / name
        run.mkdir()
        stamp_attempt(run, 1)
        later = (run / "server" / "attempt1" / "started").stat().st_mtime_ns + 10**6
        summary = {"status": "completed", "final_step": 3} if final else {"status": "running"}
        (run / "summary.json").write_text(json.dumps(summary))
        events = [{"event": "spawn", "t": 0.1, "attempt": 0}] + [
            {"event": "step", "t": 1.0 + k, "attempt": 0, "step": k + 1, "loss": 1.0}
            for k in range(3)
        ]
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        for f in ("summary.json", "events.jsonl"):
            os.utime(run / f, ns=(later, later))
        if name == "ahead":
            read_exit_ahead(run, 1)
            assert len(ahead._ahead) == (1 if final else 2)
        runs[name] = settle_summary(run, 1, "killed")
        assert not ahead._ahead, "what was read ahead waits no longer"
    assert runs["ahead"] == runs["inline"]
    assert runs["ahead"].get("from_events", False) is not final
