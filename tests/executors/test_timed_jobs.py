"""A job user may not leave work for cron or at: its name lands in each installed tool's
deny file once, on a line of its own; a tool with an allow file, or not installed, is
left alone; a deny file that cannot be written is logged, not fatal. The files are
stand-ins in a temporary folder and the tools stand-in scripts on PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.executors.timed_jobs import TimedTool, deny_timed_jobs


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TimedTool, TimedTool]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("fakecron", "fakeat"):
        (bin_dir / command).write_text("#!/bin/sh\n")
        (bin_dir / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return (
        TimedTool("fakecron", tmp_path / "cron.deny", tmp_path / "cron.allow"),
        TimedTool("fakeat", tmp_path / "at.deny", tmp_path / "at.allow"),
    )


def test_a_job_user_is_denied_once_by_each_tool(tools: tuple[TimedTool, TimedTool]) -> None:
    cron, at = tools
    cron.deny.write_text("daemon")  # an operator's file, its last line unterminated
    assert deny_timed_jobs("argosy-job-a", tools) == ["fakecron", "fakeat"]
    assert deny_timed_jobs("argosy-job-a", tools) == []  # already there
    assert deny_timed_jobs("argosy-job-b", tools) == ["fakecron", "fakeat"]
    assert cron.deny.read_text() == "daemon\nargosy-job-a\nargosy-job-b\n"
    assert at.deny.read_text() == "argosy-job-a\nargosy-job-b\n"
    assert oct(at.deny.stat().st_mode & 0o777) == "0o644"


def test_an_allow_file_or_a_missing_tool_is_left_alone(
    tools: tuple[TimedTool, TimedTool], tmp_path: Path
) -> None:
    cron, at = tools
    cron.allow.write_text("alice\n")  # only alice may: the job user is refused already
    absent = TimedTool("no-such-tool-here", tmp_path / "x.deny", tmp_path / "x.allow")
    assert deny_timed_jobs("argosy-job-a", (cron, at, absent)) == ["fakeat"]
    assert not cron.deny.exists() and not absent.deny.exists()


def test_a_deny_file_that_cannot_be_written_is_logged_not_raised(
    tools: tuple[TimedTool, TimedTool], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cron, at = tools
    target = tmp_path / "elsewhere"
    cron.deny.symlink_to(target)  # never written through a link
    assert deny_timed_jobs("argosy-job-a", tools) == ["fakeat"]
    assert not target.exists() and "could not deny fakecron" in caplog.text


@settings(max_examples=40, deadline=None)
@given(names=st.lists(st.from_regex(r"argosy-job-[a-z0-9]{1,8}", fullmatch=True), max_size=6))
def test_every_name_is_listed_exactly_once_whatever_the_order(names: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        bin_dir = Path(folder) / "bin"
        bin_dir.mkdir()
        (bin_dir / "fakecron").write_text("#!/bin/sh\n")
        (bin_dir / "fakecron").chmod(0o755)
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        tool = TimedTool("fakecron", Path(folder) / "d", Path(folder) / "a")
        for name in names + names:
            deny_timed_jobs(name, (tool,))
        listed = tool.deny.read_text().split() if names else []
        assert sorted(listed) == sorted(set(names))
