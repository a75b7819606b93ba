"""The local executor on its own: attempts as `argosy launch` processes, their exits, and
adoption by a second executor (what a restarted server does)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from argosy.core.procs import pid_alive
from argosy.executors import Executor, executors
from argosy.executors.base import LaunchRequest, describe_exit, is_lost
from argosy.executors.local import LocalExecutor, LocalOptions, attempt_dir, kill_job_processes

pytestmark = pytest.mark.integration

SLEEPER = "import sys, time\nprint('up', flush=True)\ntime.sleep(float(sys.argv[1]))\n"


def request(tmp_path: Path, job_id: str, seconds: float, attempt: int = 1) -> LaunchRequest:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    return LaunchRequest(
        job_id=job_id,
        attempt=attempt,
        script=str(script),
        args=(str(seconds),),
        nproc_per_node=1,
        run_dir=tmp_path / "runs" / job_id,
        nodes={"h": 1},
        chip="cpu",
        max_restarts=0,
    )


def wait_exits(executor: Executor, timeout_s: float = 30.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = executor.poll()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("no exit reported")


def test_registry_knows_both_executors() -> None:
    assert executors.names() == ["local", "ray"]
    assert isinstance(executors.get("local")(), Executor)


def test_inventory_offers_the_configured_cpu_slots() -> None:
    nodes = LocalExecutor(LocalOptions(slots=3)).inventory()
    assert [(n.chip, n.devices) for n in nodes] == [("cpu", 3)]


@pytest.mark.parametrize(
    ("code", "want_lost", "want_words"),
    [
        (0, False, "exited 0"),
        (1, False, "exited 1"),
        (137, True, "SIGKILL"),
        (None, True, "vanished"),
    ],
    ids=["ok", "failed", "killed", "vanished"],
)
def test_exit_statuses_read_as_words(code: int | None, want_lost: bool, want_words: str) -> None:
    assert is_lost(code) == want_lost and want_words in describe_exit(code)


def test_an_attempt_runs_and_exits_0(tmp_path: Path) -> None:
    executor = LocalExecutor()
    executor.start(request(tmp_path, "ja", 0.1))
    (exit_,) = wait_exits(executor)
    assert (exit_.job_id, exit_.attempt, exit_.exit_code, exit_.lost) == ("ja", 1, 0, False)
    assert (attempt_dir(tmp_path / "runs" / "ja", 1) / "exit.code").read_text().strip() == "0"


def test_a_second_executor_adopts_a_running_attempt_and_sees_it_end(tmp_path: Path) -> None:
    first = LocalExecutor()
    req = request(tmp_path, "jb", 3.0)
    first.start(req)
    assert second_adopts(req) is None  # still running: adopted, not restarted
    other = LocalExecutor()
    assert other.adopt("jb", 1, req.run_dir) is None
    (exit_,) = wait_exits(other)
    assert exit_.exit_code == 0 and not exit_.lost
    first.poll()  # reap


def second_adopts(req: LaunchRequest):  # noqa: ANN201
    return LocalExecutor().adopt(req.job_id, req.attempt, req.run_dir)


def test_a_killed_launcher_is_lost_and_its_ranks_are_stopped(tmp_path: Path) -> None:
    executor = LocalExecutor()
    req = request(tmp_path, "jc", 60.0)
    executor.start(req)
    where = attempt_dir(req.run_dir, 1)
    rank_log = req.run_dir / "logs" / "attempt0" / "rank0.log"
    deadline = time.monotonic() + 30
    while not (rank_log.exists() and "up" in rank_log.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(int((where / "launch.pid").read_text()), signal.SIGKILL)
    (exit_,) = wait_exits(executor)
    assert exit_.lost and exit_.exit_code == 137 and "SIGKILL" in exit_.reason
    assert kill_job_processes("jc") == 0  # the orphaned rank is gone already


def test_stop_ends_the_attempt_through_the_launcher(tmp_path: Path) -> None:
    executor = LocalExecutor()
    req = request(tmp_path, "jd", 60.0)
    executor.start(req)
    rank_log = req.run_dir / "logs" / "attempt0" / "rank0.log"
    deadline = time.monotonic() + 30
    while not (rank_log.exists() and "up" in rank_log.read_text()):
        assert time.monotonic() < deadline  # ranks run: the launcher handles SIGTERM now
        time.sleep(0.05)
    executor.stop("jd")
    (exit_,) = wait_exits(executor)
    assert exit_.exit_code == 130  # argosy launch's "interrupted"


def test_adopting_an_attempt_with_no_trace_reports_it_lost(tmp_path: Path) -> None:
    exit_ = LocalExecutor().adopt("je", 4, tmp_path / "nowhere")
    assert exit_ is not None and exit_.lost and exit_.exit_code is None


def test_job_processes_are_found_by_their_environment(tmp_path: Path) -> None:
    import subprocess

    env = dict(os.environ, ARGOSY_JOB_ID="jf")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    time.sleep(0.2)
    assert kill_job_processes("jf") == 1
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_a_new_attempt_replaces_a_tracked_older_one(tmp_path: Path) -> None:
    executor = LocalExecutor()
    executor.start(request(tmp_path, "jg", 60.0, attempt=1))
    old = attempt_dir(tmp_path / "runs" / "jg", 1) / "wrapper.pid"
    wrapper = int(old.read_text())
    executor.start(request(tmp_path, "jg", 0.1, attempt=2))
    deadline = time.monotonic() + 10
    while Path(f"/proc/{wrapper}").exists() and "Z" not in stat_state(wrapper):
        assert time.monotonic() < deadline, "the older attempt still runs"
        time.sleep(0.05)
    (exit_,) = wait_exits(executor)
    assert exit_.attempt == 2 and exit_.exit_code == 0


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


ENV_PROBE = (
    "import os, sys, time\n"
    "env = os.environ.get\n"
    "print('env', env('WANT'), env('ARGOSY_JOB_ID'), os.getcwd(), flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def warm_request(tmp_path: Path, job_id: str, seconds: float) -> LaunchRequest:
    script = tmp_path / "probe.py"
    script.write_text(ENV_PROBE)
    (tmp_path / "work").mkdir(exist_ok=True)
    return LaunchRequest(
        job_id=job_id,
        attempt=1,
        script=str(script),
        args=(str(seconds),),
        nproc_per_node=1,
        run_dir=tmp_path / "runs" / job_id,
        nodes={"h": 1},
        chip="cpu",
        workdir=str(tmp_path / "work"),
        max_restarts=0,
        env={"WANT": "yes"},
    )


def test_a_warm_launcher_runs_the_attempt_with_its_environment_and_workdir(
    tmp_path: Path,
) -> None:
    executor = LocalExecutor(LocalOptions(warm=True))
    try:
        req = warm_request(tmp_path, "jw", 0.1)
        executor.start(req)
        (exit_,) = wait_exits(executor)
        assert (exit_.exit_code, exit_.lost) == (0, False)
        log = (req.run_dir / "logs" / "attempt0" / "rank0.log").read_text()
        assert f"env yes jw {tmp_path / 'work'}" in log
        assert (attempt_dir(req.run_dir, 1) / "launch.pid").exists()
    finally:
        executor.close()


def test_a_warm_attempt_is_adopted_and_a_reused_pid_is_not(tmp_path: Path) -> None:
    executor = LocalExecutor(LocalOptions(warm=True))
    try:
        req = warm_request(tmp_path, "jx", 60.0)
        executor.start(req)
        assert second_adopts(req) is None  # same wrapper: its start time matches
        stamp = attempt_dir(req.run_dir, 1) / "wrapper.start"
        stamp.write_text(str(int(stamp.read_text()) - 1))  # as if the pid were reused
        exit_ = second_adopts(req)
        assert exit_ is not None and exit_.lost and exit_.exit_code is None
        launcher = int((attempt_dir(req.run_dir, 1) / "launch.pid").read_text())
        if executor.cgroups is None:  # the environment scan misses a warm launcher
            os.kill(launcher, signal.SIGKILL)
        (exit_,) = wait_exits(executor)
        assert not pid_alive(launcher)  # an attempt called lost never runs on beside the next
        # the wrapper outlives its launcher to record 137, unless the cgroup took both
        assert exit_.exit_code == (None if executor.cgroups else 137) and exit_.lost
    finally:
        executor.close()


def test_closing_ends_the_unused_warm_process(tmp_path: Path) -> None:
    executor = LocalExecutor(LocalOptions(warm=True))
    waiting = executor._warm[None]._proc  # noqa: SLF001  # the process under test
    executor.close()
    assert waiting.wait(timeout=30) == 0
