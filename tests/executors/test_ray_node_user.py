"""Who a Ray node rank runs as, decided on its node (`NodeRunner.start` with a `NodeJob`,
called in-process here; tests/executors/test_ray_executor.py runs it in real actors).

Under root, with the server's settings naming job users: the launcher runs as the
queue's user with no supplementary groups, `HOME` its run directory and nothing secret
in its environment; the run directory is root's with the user's group (1770) and the
attempt's records root's (0711), the log the user's own. Where the log's name is a
planted link, nothing is opened through it. Needs root (switching users).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from argosy.executors.isolation import JobUsers, user_name_for
from argosy.executors.local import JOB_ENV, attempt_dir
from argosy.executors.ray_launch import NodeJob, NodeRunner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

REPORT = (
    "import json, os; print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(),"
    " 'groups': os.getgroups(), 'env': dict(os.environ)}), flush=True)"
)


@pytest.fixture
def runs() -> Iterator[Path]:
    """A `runs/` directory job users may pass (pytest's temp root is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="argosy-node-user-", dir="/tmp"))
    os.chmod(base, 0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _run(runner: NodeRunner, command: list[str], run_dir: Path, job: NodeJob | None) -> Path:
    log = attempt_dir(run_dir, 1) / "node0.log"
    runner.start(command, {JOB_ENV: "j-user", "ARGOSY_RUN_DIR": str(run_dir)}, None, str(log), job)
    deadline = time.monotonic() + 60  # a bound on a wait, not a speed check
    while runner.poll() is None:
        assert time.monotonic() < deadline, "the launcher did not exit"
        time.sleep(0.05)
    assert runner.poll() == 0, log.read_text()
    return log


def test_a_node_rank_runs_as_its_queue_s_user_in_a_run_directory_it_cannot_leave(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-secret")  # the raylet's: never the job's
    run_dir = runs / "j-user"
    job = NodeJob(str(run_dir), "team-ray", JobUsers(), ("EXTRA_KNOB",))
    monkeypatch.setenv("EXTRA_KNOB", "on")
    log = _run(NodeRunner(), [sys.executable, "-c", REPORT], run_dir, job)
    user = pwd.getpwnam(user_name_for("argosy-job", "team-ray"))
    seen = json.loads(log.read_text().strip().splitlines()[-1])
    assert (seen["uid"], seen["gid"], seen["groups"]) == (user.pw_uid, user.pw_gid, [])
    env = seen["env"]
    assert env["HOME"] == str(run_dir) and env["USER"] == user.pw_name
    assert env["EXTRA_KNOB"] == "on" and "RAY_AUTH_TOKEN" not in env
    assert env["ARGOSY_CACHE_DIR"].endswith(user.pw_name)
    info = run_dir.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, user.pw_gid, 0o1770)
    records = log.parent.stat()
    assert (records.st_uid, stat.S_IMODE(records.st_mode)) == (0, 0o711)
    mine = log.stat()
    assert (mine.st_uid, stat.S_IMODE(mine.st_mode)) == (user.pw_uid, 0o600)


@pytest.mark.parametrize("users", [JobUsers(), None], ids=["job-user", "ray-user"])
def test_a_link_planted_as_the_log_is_never_written_through(
    runs: Path, users: JobUsers | None
) -> None:
    run_dir = runs / "j-link"
    target = runs / "victim"
    target.write_text("untouched")
    log = attempt_dir(run_dir, 1) / "node0.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(target)
    job = NodeJob(str(run_dir), "team-ray", users)
    with pytest.raises(OSError):
        NodeRunner().start([sys.executable, "-c", "print('x')"], {}, None, str(log), job)
    assert target.read_text() == "untouched"


def test_a_node_whose_job_user_has_other_ids_than_the_server_s_refuses_to_start(
    runs: Path,
) -> None:
    """The server names the job user's ids; a node where that user has others (a queue
    picked so that its user's planned uid is another queue's) starts nothing."""
    from argosy.core.errors import ArgosyError
    from argosy.executors.isolation import ensure_user

    here = ensure_user(user_name_for("argosy-job", "team-ray"))  # as the node has it
    wrong = (here.uid + 1, here.gid + 1)
    run_dir = runs / "j-ids"
    log = attempt_dir(run_dir, 1) / "node0.log"
    job = NodeJob(str(run_dir), "team-ray", JobUsers(), (), wrong)
    runner = NodeRunner()
    with pytest.raises(ArgosyError, match="on the server's"):
        runner.start([sys.executable, "-c", "print('x')"], {}, None, str(log), job)
    assert runner.proc is None and not log.exists()


def test_a_workdir_swapped_for_a_link_does_not_lead_past_another_tenant_s_directory(
    runs: Path,
) -> None:
    """The job's user enters the workdir itself: a link planted after submit, into a
    directory below one the job may not pass (another queue's 1770 run directory), leads
    nowhere; root changing into it would have put the job inside."""
    guarded = runs / "victim"
    (guarded / "checkpoints").mkdir(parents=True)
    (guarded / "checkpoints" / "model.pt").write_text("weights")
    os.chmod(guarded, 0o1770)  # root:root here: the job's user may not pass
    os.chmod(guarded / "checkpoints", 0o755)  # what lies below is open once inside
    workdir = runs / "wd"
    workdir.symlink_to(guarded / "checkpoints")
    run_dir = runs / "j-wd"
    log = attempt_dir(run_dir, 1) / "node0.log"
    runner = NodeRunner()
    job = NodeJob(str(run_dir), "team-ray", JobUsers())
    runner.start(["cat", "model.pt"], {JOB_ENV: "j-wd"}, str(workdir), str(log), job)
    deadline = time.monotonic() + 30  # a bound on a wait, not a speed check
    while runner.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert runner.poll() == 126 and "weights" not in log.read_text(), log.read_text()


LIMITS_REPORT = (
    "import json, os, resource, sys; print(json.dumps({"
    "'nofile': resource.getrlimit(resource.RLIMIT_NOFILE)[1],"
    "'nproc': resource.getrlimit(resource.RLIMIT_NPROC)[1],"
    "'sentinel': os.path.exists('/dev/shm/' + sys.argv[1])}), flush=True)"
)


def test_a_node_rank_of_a_job_user_starts_under_the_servers_limits(runs: Path) -> None:
    """As a local attempt does: the server's rlimits (within the node's hard ones), and,
    where namespaces can be had, a /dev/shm of its own (the host's files are not there)."""
    from argosy.executors.limits import JobLimitsConfig, job_rlimits
    from argosy.executors.private_shm import available

    sentinel = f"argosy-node-{os.getpid()}-{time.monotonic_ns()}"
    Path(f"/dev/shm/{sentinel}").write_text("the host's")
    try:
        limits = JobLimitsConfig(private_shm=True)
        job = NodeJob(str(runs / "j-lim"), "team-ray", JobUsers(), limits=limits)
        log = _run(
            NodeRunner(), [sys.executable, "-c", LIMITS_REPORT, sentinel], runs / "j-lim", job
        )
    finally:
        Path(f"/dev/shm/{sentinel}").unlink(missing_ok=True)
    seen = json.loads(log.read_text().strip().splitlines()[-1])
    want = job_rlimits(limits)
    if shutil.which("prlimit"):
        assert (seen["nofile"], seen["nproc"]) == (want.nofile, want.nproc)
    assert seen["sentinel"] is not available()  # private: the host's file is not there
