"""Where there are cgroups, a job never starts outside its own: an attempt whose cgroup
cannot be made, or that cannot join it, starts nothing and ends as "could not start"
(lost), on the local executor (cold and warm) and on a Ray node's runner. The cgroups
here are stand-ins in a temporary folder (a `cgroup.procs` that is a plain file, or one
that cannot be written), so these run everywhere, root or not."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from launch_requests import script_request

from argosy.executors.base import AttemptExit, LaunchRequest
from argosy.executors.cgroups import Entry, JobCgroups
from argosy.executors.local import LocalExecutor, LocalOptions
from argosy.executors.ray_launch import NodeRunner

MARK = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')\n"


class StandIn(JobCgroups):
    """Cgroups in a plain folder: `make` gives a writable file (joining works) or, with
    `joinable=False`, a path whose folder is missing (the wrapper's write fails);
    `holding` likewise with `holdable`."""

    def __init__(self, root: Path, *, joinable: bool = True, holdable: bool = True) -> None:
        super().__init__(root)
        self.joinable, self.holdable = joinable, holdable

    def make(self, run_dir: Path, part: str) -> Path:
        group = self.path(run_dir, part)
        if not self.joinable:
            return group / "missing" / "cgroup.procs"
        group.mkdir(parents=True, exist_ok=True)
        return group / "cgroup.procs"

    def holding(self) -> Path | None:
        group = self.root / f"warm-{os.getpid()}-{len(list(self.root.iterdir()))}"
        if not self.holdable:
            return group / "missing" / "cgroup.procs"
        group.mkdir(parents=True)
        return group / "cgroup.procs"

    def enter(self, run_dir: Path, part: str) -> Entry:
        if self.joinable:
            return super().enter(run_dir, part)
        return Entry(os.open(os.devnull, os.O_RDONLY))  # a write to it fails


def request_for(tmp_path: Path, job_id: str) -> LaunchRequest:
    return script_request(tmp_path, job_id, MARK, (str(tmp_path / f"{job_id}.ran"),))


def run_one(executor: LocalExecutor, request: LaunchRequest) -> AttemptExit:
    executor.start(request)
    deadline = time.monotonic() + 60
    while not (exits := executor.poll()):
        assert time.monotonic() < deadline, "no exit reported"
        time.sleep(0.05)
    return exits[0]


@pytest.mark.integration
def test_an_attempt_that_cannot_join_its_cgroup_starts_nothing(tmp_path: Path) -> None:
    executor = LocalExecutor(LocalOptions(warm=False))
    executor.cgroups = StandIn(tmp_path / "cg", joinable=False)
    (tmp_path / "cg").mkdir()
    request = request_for(tmp_path, "jn")
    ended = run_one(executor, request)
    assert ended.exit_code is None and ended.lost
    assert "could not start" in ended.reason and "could not join the cgroup" in ended.reason
    assert not (tmp_path / "jn.ran").exists()


def test_an_attempt_whose_cgroup_cannot_be_made_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    executor = LocalExecutor(LocalOptions(warm=False))
    executor.cgroups = JobCgroups(tmp_path / "no-such-folder")
    request = request_for(tmp_path, "jm")
    with pytest.raises(OSError, match="cannot make the cgroup"):
        executor.start(request)
    time.sleep(0.2)
    assert not (tmp_path / "jm.ran").exists() and not executor.poll()


@pytest.mark.integration
def test_a_warm_process_that_cannot_join_its_holding_cgroup_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its wrapper ends without starting it; the attempt starts cold, in its own cgroup."""
    root = tmp_path / "cg"
    root.mkdir()
    stand_in = StandIn(root, holdable=False)
    monkeypatch.setattr(JobCgroups, "here", classmethod(lambda cls: stand_in))
    executor = LocalExecutor(LocalOptions(warm=True))
    try:
        waiting = executor._warm[None]._proc  # noqa: SLF001  # the warm process under test
        assert waiting.wait(timeout=10) == 1  # ended: it could not join
        request = request_for(tmp_path, "jh")
        ended = run_one(executor, request)
        assert ended.exit_code == 0 and (tmp_path / "jh.ran").exists()
        joined = stand_in.path(request.run_dir, "a1") / "cgroup.procs"
        assert joined.read_text().strip().isdigit()  # the cold wrapper joined
    finally:
        executor.close()


def test_a_ray_node_rank_that_cannot_join_its_cgroup_does_not_start(tmp_path: Path) -> None:
    runner = NodeRunner()
    runner.cgroups = StandIn(tmp_path / "cg", joinable=False)
    (tmp_path / "cg").mkdir()
    script = tmp_path / "mark.py"
    script.write_text(MARK)
    log = tmp_path / "runs" / "jr" / "server" / "attempt1" / "node0.log"
    with pytest.raises(Exception, match="preexec_fn"):
        runner.start([sys.executable, str(script), str(tmp_path / "jr.ran")], {}, None, str(log))
    time.sleep(0.2)
    assert not (tmp_path / "jr.ran").exists()
