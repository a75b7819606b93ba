"""Reads of job-written files never follow what a job can plant: symlinks (at the end or
on the way), hard links, FIFOs; and never read more than asked."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.core.confined import (
    UnsafePathError,
    list_confined,
    read_confined,
    read_job_file,
    trusted_root,
)

FIXTURE_OK = HealthCheck.function_scoped_fixture

SECRET = b"argosy_admin_secret_token"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """(run dir, secret file outside it)."""
    secret = tmp_path / "admin.token"
    secret.write_bytes(SECRET)
    run = tmp_path / "run"
    (run / "logs" / "attempt1").mkdir(parents=True)
    return run, secret


def test_a_plain_file_reads_with_limit_and_offset(tree: tuple[Path, Path]) -> None:
    run, _ = tree
    (run / "logs" / "attempt1" / "rank0.log").write_bytes(b"0123456789")
    assert read_confined(run, "logs/attempt1/rank0.log", limit=4) == b"0123"
    assert read_confined(run, "logs/attempt1/rank0.log", limit=4, offset=8) == b"89"
    assert read_confined(run, "logs/attempt1/rank0.log", limit=0) == b""
    assert read_confined(run, "logs/attempt1/missing.log", limit=4) is None


def test_a_symlink_at_the_end_is_refused(tree: tuple[Path, Path]) -> None:
    run, secret = tree
    (run / "logs" / "attempt1" / "rank0.log").symlink_to(secret)
    assert read_confined(run, "logs/attempt1/rank0.log", limit=1 << 20) is None


def test_a_symlinked_directory_on_the_way_is_refused(tree: tuple[Path, Path]) -> None:
    run, secret = tree
    (run / "logs" / "attempt2").symlink_to(secret.parent)
    assert read_confined(run, "logs/attempt2/admin.token", limit=1 << 20) is None
    assert list_confined(run, "logs/attempt2") == []
    assert list_confined(run, "logs") == ["attempt1", "attempt2"]


def test_a_hard_link_is_refused(tree: tuple[Path, Path]) -> None:
    run, secret = tree
    os.link(secret, run / "summary.json")
    assert read_confined(run, "summary.json", limit=1 << 20) is None


def test_a_fifo_does_not_block_the_reader(tree: tuple[Path, Path]) -> None:
    run, _ = tree
    os.mkfifo(run / "summary.json")
    done: list[object] = []
    reader = threading.Thread(
        target=lambda: done.append(read_confined(run, "summary.json", limit=9))
    )
    reader.start()
    reader.join(timeout=5)
    assert done == [None], "a FIFO blocked the reader or was read"


def test_paths_that_climb_out_are_refused(tree: tuple[Path, Path]) -> None:
    run, _ = tree
    for rel in ("../admin.token", "logs/../../admin.token", "/etc/passwd"):
        with pytest.raises(UnsafePathError):
            read_confined(run, rel, limit=10)


def test_trusted_root_stops_at_the_first_directory_someone_else_owns(tmp_path: Path) -> None:
    """Owned by this user all the way: the file's own directory is the trusted root (a
    job of another user would own the directories below its run directory)."""
    path = tmp_path / "a" / "b" / "f.txt"
    path.parent.mkdir(parents=True)
    path.write_text("x")
    assert trusted_root(path) == path.parent
    assert read_job_file(path, limit=5) == b"x"
    link = tmp_path / "a" / "b" / "g.txt"
    link.symlink_to(path)
    assert read_job_file(link, limit=5) is None  # the last component is never followed


KINDS = ("file", "dir", "link_secret", "link_outside_dir", "hardlink_secret", "fifo")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(KINDS), st.lists(st.sampled_from("abc"), min_size=1, max_size=3)),
        min_size=1,
        max_size=12,
    ),
    probe=st.lists(st.sampled_from("abc"), min_size=1, max_size=4),
)
def test_no_tree_a_job_can_build_reads_the_secret(
    tmp_path_factory: pytest.TempPathFactory, plan: list, probe: list[str]
) -> None:
    """Whatever mix of files, directories, links and FIFOs a job lays out, a confined
    read returns either nothing or a file the job itself wrote, never the secret."""
    base = tmp_path_factory.mktemp("t")
    secret = base / "secret"
    secret.write_bytes(SECRET)
    run = base / "run"
    run.mkdir()
    for kind, parts in plan:
        path = run.joinpath(*parts)
        if not path.parent.is_dir() or os.path.lexists(path):
            continue
        if kind == "file":
            path.write_bytes(b"job data")
        elif kind == "dir":
            path.mkdir()
        elif kind == "link_secret":
            path.symlink_to(secret)
        elif kind == "link_outside_dir":
            path.symlink_to(base)
        elif kind == "hardlink_secret":
            os.link(secret, path)
        else:
            os.mkfifo(path)
    started = time.monotonic()
    for rel in ("/".join(probe), "/".join([*probe, "secret"])):
        got = read_confined(run, rel, limit=1 << 10)
        assert got in (None, b"job data"), (rel, got)
    assert time.monotonic() - started < 5
