"""Nothing a job starts outlives it: a process that leaves the job's session and clears its
environment (`setsid env -i ...`), which the environment scan cannot find, is in the
attempt's cgroup and ends with the attempt, after a success as after a failure, on the
local executor (cold and warm) and on a Ray node's runner. The parsing of /proc runs
everywhere; the rest needs a cgroup v2 this process may write (root, or a delegated one)."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from launch_requests import script_request

from argosy.core.procs import pid_alive
from argosy.executors.base import LaunchRequest
from argosy.executors.cgroups import (
    JobCgroups,
    cgroup2_mount,
    group_key,
    kill_group,
    own_cgroup,
)
from argosy.executors.local import LocalExecutor, LocalOptions
from argosy.executors.ray_launch import NodeRunner

HYBRID = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev shared:10 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory
"""
PURE = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - cgroup2 cgroup2 rw\n"
ESCAPED = "35 24 0:30 / /mnt/cg\\040root rw shared:9 - cgroup2 none rw\n"
V1_ONLY = "27 25 0:24 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory\n"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (HYBRID, "/sys/fs/cgroup/unified"),
        (PURE, "/sys/fs/cgroup"),
        (ESCAPED, "/mnt/cg root"),
        (V1_ONLY, None),
    ],
    ids=["hybrid", "pure-v2", "escaped", "v1-only"],
)
def test_the_cgroup2_mount_is_found_in_mountinfo(text: str, want: str | None) -> None:
    assert cgroup2_mount(text) == (Path(want) if want else None)


def test_the_own_cgroup_is_the_v2_line() -> None:
    text = "4:memory:/x\n0::/system.slice/argosy.service\n"
    assert own_cgroup(text) == "/system.slice/argosy.service"
    assert own_cgroup("4:memory:/x\n") is None


@given(a=st.text(min_size=1, max_size=30), b=st.text(min_size=1, max_size=30))
def test_two_run_directories_never_share_a_cgroup_prefix(a: str, b: str) -> None:
    """`kill(run_dir)` takes `<key>.*`: another run directory's cgroups never match it,
    whatever characters the names hold (none is read as a glob pattern)."""
    ra, rb = (Path("/runs") / (x.replace("/", "_").replace("\x00", "_") or "_") for x in (a, b))
    ka, kb = group_key(ra), group_key(rb)
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", ka)
    if ra != rb:
        assert ka != kb and not fnmatch.fnmatchcase(f"{kb}.a1", f"{ka}.*")


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, as /proc shows them now (pid excluded)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


GROUPS = JobCgroups.here()
NEEDS_CGROUPS = pytest.mark.skipif(GROUPS is None, reason="no cgroup v2 this process may write")

LINGER = """\
import os, subprocess, sys, time
pid_file, code = sys.argv[1], int(sys.argv[2])
quit_job = "echo $$ > $0.tmp && mv $0.tmp $0 && exec sleep 300"  # a session of its own
subprocess.Popen(["setsid", "env", "-i", "/bin/sh", "-c", quit_job, pid_file])
while not os.path.exists(pid_file):
    time.sleep(0.01)
sys.exit(code)
"""


def lingering_pid(pid_file: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the job never started its lingering process"
        time.sleep(0.02)
    return int(pid_file.read_text())


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@NEEDS_CGROUPS
def test_killing_a_run_directory_s_cgroups_ends_every_member_and_removes_them(
    tmp_path: Path,
) -> None:
    assert GROUPS is not None
    mine, other = tmp_path / "runs" / "j1", tmp_path / "runs" / "j2"
    pids = {}
    for run, part in ((mine, "a1"), (mine, "a2"), (other, "a1")):
        entry = GROUPS.enter(run, part)
        assert entry is not None
        pid_file = tmp_path / f"{run.name}-{part}.pid"
        proc = subprocess.Popen(
            [sys.executable, "-c", LINGER, str(pid_file), "0"], preexec_fn=entry
        )
        entry.close()
        proc.wait()
        pids[run.name, part] = lingering_pid(pid_file)
    assert GROUPS.kill(mine, "a1") == 1  # one part alone
    assert gone(pids["j1", "a1"]) and pid_alive(pids["j1", "a2"])
    assert GROUPS.kill(mine) == 1  # every part of the run directory, no other's
    assert gone(pids["j1", "a2"]) and pid_alive(pids["j2", "a1"])
    assert not list(GROUPS.root.glob(f"{group_key(mine)}.*"))  # removed
    assert GROUPS.kill(other) == 1 and gone(pids["j2", "a1"])


def linger_request(tmp_path: Path, job_id: str, code: int) -> LaunchRequest:
    return script_request(tmp_path, job_id, LINGER, (str(tmp_path / f"{job_id}.pid"), str(code)))


@NEEDS_CGROUPS
@pytest.mark.integration
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("code", [0, 1], ids=["succeeded", "failed"])
def test_a_process_that_left_the_job_ends_with_its_attempt(
    tmp_path: Path, warm: bool, code: int
) -> None:
    executor = LocalExecutor(LocalOptions(warm=warm))
    try:
        job_id = f"jl{code}{'w' if warm else 'c'}"  # the environment scan is machine-wide
        request = linger_request(tmp_path, job_id, code)
        executor.start(request)
        pid = lingering_pid(tmp_path / f"{job_id}.pid")
        deadline = time.monotonic() + 60
        while not (exits := executor.poll()):
            assert time.monotonic() < deadline, "no exit reported"
            time.sleep(0.05)
        assert exits[0].exit_code == code
        assert gone(pid), "a process that left the job's session outlived the attempt"
    finally:
        executor.close()


@NEEDS_CGROUPS
@pytest.mark.integration
def test_a_warm_process_taken_before_its_wrapper_joined_its_cgroup_stays_confined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next start of a user can take the waiting process spawned by the previous
    start before its wrapper has joined its holding cgroup (a loaded host, a burst of
    starts). Its attempt must still run in the attempt's cgroup, so what it leaves
    behind ends with it (a succeeded attempt has no environment scan to fall back on)."""
    from argosy.executors import warm_launcher

    slow = "sleep 0.5\n" + warm_launcher.WARM_WRAPPER  # the wrapper joins half a second late
    monkeypatch.setattr(warm_launcher, "WARM_WRAPPER", slow)
    executor = LocalExecutor(LocalOptions(warm=True))
    try:
        request = linger_request(tmp_path, "jw-late", 0)
        executor.start(request)  # at once: the waiting process's wrapper has not joined
        pid = lingering_pid(tmp_path / "jw-late.pid")
        deadline = time.monotonic() + 60
        while not (exits := executor.poll()):
            assert time.monotonic() < deadline, "no exit reported"
            time.sleep(0.05)
        assert exits[0].exit_code == 0
        assert gone(pid), "the attempt ran outside its cgroup: what it left outlived it"
    finally:
        executor.close()


@NEEDS_CGROUPS
def test_a_ray_node_rank_s_leftovers_end_when_its_launcher_has_ended(tmp_path: Path) -> None:
    """The runner, on its own (what a Ray actor holds): once `poll` sees the launcher's
    exit, what it left running is gone."""
    script = tmp_path / "linger.py"
    script.write_text(LINGER)
    log = tmp_path / "runs" / "jr" / "server" / "attempt1" / "node0.log"
    runner = NodeRunner()
    runner.start(
        [sys.executable, str(script), str(tmp_path / "jr.pid"), "0"],
        {"ARGOSY_JOB_ID": "jr"},
        None,
        str(log),
    )
    pid = lingering_pid(tmp_path / "jr.pid")
    deadline = time.monotonic() + 30
    while runner.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert gone(pid)


@NEEDS_CGROUPS
def test_a_sweep_removes_empty_cgroups_and_never_a_populated_one(tmp_path: Path) -> None:
    assert GROUPS is not None
    own = GROUPS.root / f"sweep-{tmp_path.name}-{os.getpid()}"  # other tests' stay out of it
    own.mkdir()
    groups = JobCgroups(own)
    try:
        _sweep_in(groups, tmp_path / "runs" / "js")
    finally:
        own.rmdir()


def _sweep_in(groups: JobCgroups, run: Path) -> None:
    empty = groups.path(run, "a1")
    empty.mkdir()
    entry = groups.enter(run, "a2")
    assert entry is not None
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=entry)
    entry.close()
    try:
        assert groups.sweep(older_than_s=3600) == 0 and empty.exists()  # young: left
        groups.sweep(older_than_s=0)
        assert not empty.exists() and groups.path(run, "a2").exists()
    finally:
        assert groups.kill(run) == 1
        proc.wait()
    assert not groups.path(run, "a2").exists()


@NEEDS_CGROUPS
def test_a_holding_cgroup_moves_whole_into_the_attempt_s_even_while_it_forks(
    tmp_path: Path,
) -> None:
    """`adopt` moves every member of a holding cgroup, a shell that keeps starting
    children meanwhile included, and removes the holding one."""
    assert GROUPS is not None
    run = tmp_path / "runs" / "jm"
    held = GROUPS.holding()
    assert held is not None
    forker = 'echo $$ > "$0"; for i in 1 2 3 4 5 6 7 8; do sleep 60 & done; wait'
    proc = subprocess.Popen(["sh", "-c", forker, str(held)])
    try:
        time.sleep(0.05)
        assert GROUPS.adopt(run, "a1", held)
        assert not held.parent.exists()
        inside = set(map(int, (GROUPS.path(run, "a1") / "cgroup.procs").read_text().split()))
        assert {proc.pid, *descendants(proc.pid)} <= inside
    finally:
        GROUPS.kill(run)
        proc.wait()


@NEEDS_CGROUPS
def test_a_dead_server_s_holding_cgroups_are_killed_at_the_next_start() -> None:
    """A holding cgroup is named after its server's pid: once that pid is gone, the next
    `here()` kills what is still in it."""
    assert GROUPS is not None
    gone_pid = subprocess.Popen(["true"])
    gone_pid.wait()
    stale = GROUPS.root / f"warm-{gone_pid.pid}-1"
    stale.mkdir()
    mine = GROUPS.holding()  # this process's: alive, left alone
    assert mine is not None
    lodgers = [
        subprocess.Popen(["sh", "-c", 'echo $$ > "$0"; exec sleep 60', str(p)])
        for p in (stale / "cgroup.procs", mine)
    ]
    time.sleep(0.1)
    assert JobCgroups.here() is not None
    assert lodgers[0].wait(timeout=5) == -9 and not stale.exists()
    assert lodgers[1].poll() is None
    kill_group(mine.parent)
    lodgers[1].wait()


@NEEDS_CGROUPS
@pytest.mark.integration
def test_what_reached_a_waiting_warm_process_ends_with_the_attempt_that_takes_it(
    tmp_path: Path,
) -> None:
    """A process that got into the waiting warm launcher's cgroup (a job of the same user
    that attached to it, started something there and left the session) is moved along
    with it into the next attempt's cgroup and killed when that attempt ends; one in a
    warm process that is never taken dies when the executor closes."""
    executor = LocalExecutor(LocalOptions(warm=True))
    try:
        held = executor._warm[None]._held  # noqa: SLF001  # the holding cgroup under test
        assert held is not None
        squatter = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$0"; exec setsid sleep 300', str(held)]
        )
        time.sleep(0.1)
        request = linger_request(tmp_path, "jw-took", 0)
        executor.start(request)
        lingering_pid(tmp_path / "jw-took.pid")
        deadline = time.monotonic() + 60
        while not executor.poll():
            assert time.monotonic() < deadline, "no exit reported"
            time.sleep(0.05)
        assert squatter.wait(timeout=5) == -9  # ended with the attempt that took the process
        held = executor._warm[None]._held  # noqa: SLF001  # the next waiting one's
        assert held is not None
        untaken = subprocess.Popen(["sh", "-c", 'echo $$ > "$0"; exec sleep 300', str(held)])
        time.sleep(0.1)
    finally:
        executor.close()
    assert untaken.wait(timeout=5) == -9 and not held.parent.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a second user to attach from needs root")
def test_a_waiting_warm_process_cannot_be_attached_to_by_its_own_user() -> None:
    """`not_dumpable`: ptrace from another process of the same uid is refused (without it,
    a host without Yama lets it attach and run code in the waiting launcher)."""
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for dumpable, want in ((False, "refused"), (True, "attached")):
        step = (
            "" if dumpable else "from argosy.executors.warm import not_dumpable; not_dumpable(); "
        )
        target = subprocess.Popen(
            [*nobody, sys.executable, "-c", f"{step}import time; time.sleep(30)"],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        try:
            time.sleep(1.0)
            attach = (
                "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True)\n"
                "ok = libc.ptrace(16, int(sys.argv[1]), 0, 0) == 0\n"  # PTRACE_ATTACH
                "print('attached' if ok else 'refused')\n"
            )
            out = subprocess.run(
                [*nobody, sys.executable, "-c", attach, str(target.pid)],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
            if dumpable and out == "refused":
                return  # this host forbids same-user ptrace anyway (Yama ptrace_scope >= 1)
            assert out == want, (dumpable, out)
        finally:
            target.kill()
            target.wait()


def test_a_kill_waits_no_longer_than_it_was_told_for_a_member_that_stays(
    tmp_path: Path,
) -> None:
    """A member stuck in the kernel never leaves `cgroup.procs`: the kill gives up after
    `wait_s` (the server's loop waits with it) and leaves the cgroup for the sweep. A
    stand-in cgroup (a plain folder whose `cgroup.procs` names a process that lives on)."""
    groups = JobCgroups(tmp_path)
    run = tmp_path / "runs" / "stuck"
    group = groups.path(run, "a1")
    group.mkdir()
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    began = time.monotonic()
    assert groups.kill(run, wait_s=0.1) == 1
    assert time.monotonic() - began < 1.0 and group.exists()
