"""Pids read from files outlive their processes, and pids wrap (at 32,768 on many hosts):
whatever argosy signals by a recorded pid must be the process it recorded, never a stranger
that reuses the number (once, the test suite's own browser and console server)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_local_executor import request

from argosy.cli.demo import FaultInjector
from argosy.core.procs import env_holds, pid_alive, start_ticks
from argosy.executors.local import LocalExecutor, attempt_dir, kill_leftovers, launcher_pid

pytestmark = pytest.mark.integration


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen]:
    """A live process of this user that no attempt or job ever started."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def plant_attempt(runs: Path, pid: int, wrapper_start: int) -> Path:
    where = attempt_dir(runs / "j1", 1)
    where.mkdir(parents=True)
    (where / "launch.pid").write_text(str(pid))
    (where / "wrapper.start").write_text(str(wrapper_start))
    return where


def test_a_stale_launch_pid_naming_a_stranger_is_never_signalled(
    tmp_path: Path, stranger: subprocess.Popen
) -> None:
    long_before = start_ticks(stranger.pid) - 3600 * 100  # a wrapper of an hour earlier
    where = plant_attempt(tmp_path / "runs", stranger.pid, long_before)
    assert launcher_pid(where) is None
    assert kill_leftovers(tmp_path / "runs") == 0
    time.sleep(0.1)
    assert stranger.poll() is None


def test_look_alike_attempts_a_job_could_plant_are_never_signalled(
    tmp_path: Path, stranger: subprocess.Popen
) -> None:
    """A job can write its run directory: records deeper than `<run>/server/attempt*` (or
    a replica's `<run>/r<i>/server/attempt*`), or reached through a link, are not the
    server's, even when they name a live process as its launcher would be named."""
    runs = tmp_path / "runs"
    ticks = start_ticks(stranger.pid)
    for planted in (runs / "j1" / "deep" / "server" / "attempt1", tmp_path / "out" / "attempt1"):
        planted.mkdir(parents=True)
        (planted / "launch.pid").write_text(str(stranger.pid))
        (planted / "wrapper.start").write_text(str(ticks))
        assert launcher_pid(planted) == stranger.pid  # it would pass the pid check
    (runs / "j1" / "r1").mkdir()
    (runs / "j1" / "r1" / "server").symlink_to(tmp_path / "out")  # a replica's, by a link
    assert kill_leftovers(runs) == 0
    time.sleep(0.1)
    assert stranger.poll() is None


def test_a_stranger_started_before_the_wrapper_is_not_its_launcher(
    tmp_path: Path, stranger: subprocess.Popen
) -> None:
    where = plant_attempt(tmp_path / "runs", stranger.pid, start_ticks(stranger.pid) + 1)
    assert launcher_pid(where) is None


def test_a_running_launcher_is_found_and_killed_with_its_ranks(tmp_path: Path) -> None:
    executor = LocalExecutor()
    req = request(tmp_path, "jl", seconds=60)
    executor.start(req)
    where = attempt_dir(req.run_dir, 1)
    deadline = time.monotonic() + 30
    while launcher_pid(where) is None:
        assert time.monotonic() < deadline, "no launcher recorded"
        time.sleep(0.05)
    pid = launcher_pid(where)
    assert pid == int((where / "launch.pid").read_text())
    assert kill_leftovers(tmp_path / "runs") >= 1
    deadline = time.monotonic() + 10
    while pid_alive(pid):
        assert time.monotonic() < deadline, "the launcher survived"
        time.sleep(0.05)
    executor.close()


def spawn_event(run_dir: Path, pid: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    event = {"event": "spawn", "pids": [pid]}
    (run_dir / "events.jsonl").write_text(json.dumps(event) + "\n")


def test_the_demo_fault_spares_a_stranger_and_kills_the_jobs_rank(
    tmp_path: Path, stranger: subprocess.Popen
) -> None:
    spawn_event(tmp_path / "run", stranger.pid)
    assert not FaultInjector(tmp_path / "run", "job-1", rank=0, after_step=1).maybe_fire(5)
    assert stranger.poll() is None
    env = {"ARGOSY_JOB_ID": "job-1", "PATH": "/usr/bin:/bin"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 10  # its environment shows once it has run a little
        while not env_holds(rank.pid, "ARGOSY_JOB_ID", "job-1"):
            assert time.monotonic() < deadline, "the rank's environment never showed its job"
            time.sleep(0.02)
        spawn_event(tmp_path / "run", rank.pid)
        injector = FaultInjector(tmp_path / "run", "job-1", rank=0, after_step=1)
        assert not injector.maybe_fire(0)  # its step not reached yet
        assert injector.maybe_fire(5)
        assert rank.wait(timeout=10) == -9
    finally:
        rank.kill()
        rank.wait()


def test_a_zygote_worker_whose_pid_names_a_later_process_is_gone_and_never_killed(
    stranger: subprocess.Popen,
) -> None:
    from argosy.serving.zygote import ForkedWorker

    worker = ForkedWorker(stranger.pid, zygote_pid=0)
    assert worker.is_alive()
    worker._started -= 1  # the pid now names a process that started at another time
    assert not worker.is_alive()
    worker.kill()
    worker.join(timeout=1)
    time.sleep(0.1)
    assert stranger.poll() is None
    real = ForkedWorker(stranger.pid, zygote_pid=0)
    real.kill()
    assert stranger.wait(timeout=10) == -9
