"""Attempts are limited by the kernel where the cgroup v2 hierarchy gives the server the
`pids`, `memory` and `cpu` controllers: the limits are written into the attempt's cgroup
before anything joins it, a fork past `pids.max` fails, and a process past `memory.max`
is killed, its attempt failed with a reason that says so. Where the controllers cannot be
had (a hybrid v1/v2 host, a cgroup not delegated), attempts start anyway, unlimited, and
the log says so once."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_requests import command_request

from argosy.executors.cgroup_controllers import SERVER_LEAF, enable_controllers, read_end
from argosy.executors.cgroups import JobCgroups
from argosy.executors.limits import GIB, JobLimitsConfig, PartLimits
from argosy.executors.local import LocalExecutor, LocalOptions

GROUPS = JobCgroups.here()
NEEDS_CGROUPS = pytest.mark.skipif(GROUPS is None, reason="no cgroup v2 this process may write")


@pytest.fixture(scope="module")
def limited() -> JobCgroups:
    """The job cgroups with every controller the hierarchy allows enabled."""
    if GROUPS is None:
        pytest.skip("no cgroup v2 this process may write")
    enabled = GROUPS.limit({})
    if not enabled.controllers:
        pytest.skip(f"no controller can be enabled here: {enabled.note()}")
    return GROUPS


def needs(groups: JobCgroups, *controllers: str) -> None:
    missing = set(controllers) - groups.controllers
    if missing:
        pytest.skip(f"the {', '.join(sorted(missing))} controller cannot be enabled here")


def wait_exit(executor: LocalExecutor, timeout_s: float = 60):  # noqa: ANN201
    deadline = time.monotonic() + timeout_s
    while not (exits := executor.poll()):
        assert time.monotonic() < deadline, "no exit reported"
        time.sleep(0.05)
    return exits[0]


class StandInKernel:
    """cgroup v2's rules for a tree of plain folders: a cgroup's children get a controller
    once it is in the cgroup's `subtree_control`, which needs the cgroup to have it
    (ENOENT) and, but at the root, to hold no process (EBUSY); writing a pid to
    `cgroup.procs` moves that process."""

    def __init__(self, root: Path, controllers: str) -> None:
        self.root = root
        self.make(root, controllers)

    def make(self, group: Path, controllers: str = "", procs: str = "") -> Path:
        group.mkdir(exist_ok=True)
        for name, text in (("cgroup.controllers", controllers), ("cgroup.procs", procs)):
            (group / name).write_text(text)
        (group / "cgroup.subtree_control").touch()
        return group

    def write(self, path: Path, value: str) -> None:
        group = path.parent
        if path.name == "cgroup.procs":
            for other in self.root.rglob("cgroup.procs"):
                other.write_text(" ".join(p for p in other.read_text().split() if p != value))
            if not (group / "cgroup.controllers").exists():
                self.make(group, (group.parent / "cgroup.subtree_control").read_text())
            path.write_text(f"{path.read_text()} {value}".strip())
            return
        assert path.name == "cgroup.subtree_control" and value.startswith("+")
        controller = value[1:]
        if controller not in (group / "cgroup.controllers").read_text().split():
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        if group != self.root and (group / "cgroup.procs").read_text().split():
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        enabled = set(path.read_text().split()) | {controller}
        path.write_text(" ".join(sorted(enabled)))
        for child in group.iterdir():
            if child.is_dir():
                listed = set((child / "cgroup.controllers").read_text().split())
                (child / "cgroup.controllers").write_text(" ".join(sorted(listed | enabled)))


SERVER = 4242


@pytest.mark.parametrize(
    ("name", "delegated", "others", "want_enabled", "want_moved", "want_why"),
    [
        ("argosy", "pids memory cpu", "", {"pids", "memory", "cpu"}, True, ""),
        ("argosy", "pids memory cpu", "77", set(), False, "besides this server (1)"),
        ("argosy", "pids", "", {"pids"}, True, "not given it by its parent (systemd: Delegate"),
        ("argosy.service", "pids memory cpu", "", set(), False, "DelegateSubgroup=argosy-server"),
    ],
    ids=["alone-moves-into-a-leaf", "company-stays", "partly-delegated", "systemd-unit-stays"],
)
def test_controllers_reach_the_attempts_past_the_no_internal_processes_rule(
    tmp_path: Path,
    name: str,
    delegated: str,
    others: str,
    want_enabled: set[str],
    want_moved: bool,
    want_why: str,
) -> None:
    """The server's cgroup holds the server: it can hand controllers down to
    `argosy-jobs/` only once the server is in a leaf of its own, which it moves into when
    it alone is there; with company, or out of a systemd unit's cgroup (where systemd
    starts it next time, which the kernel would then refuse), it stays and says why."""
    kernel = StandInKernel(tmp_path / "root", "pids memory cpu io")
    unit = kernel.make(kernel.root / name, delegated, f"{SERVER} {others}".strip())
    folder = kernel.make(unit / "argosy-jobs")
    enabled = enable_controllers(folder, pid=SERVER, write=kernel.write)
    assert enabled.controllers == want_enabled
    assert (SERVER_LEAF in os.listdir(unit)) == want_moved
    if want_moved:
        assert (unit / SERVER_LEAF / "cgroup.procs").read_text().split() == [str(SERVER)]
    note = enabled.note()
    assert (note is None) == (not want_why), note
    if want_why:
        assert want_why in note


def test_a_server_started_in_its_leaf_enables_in_place(tmp_path: Path) -> None:
    """Under systemd with `DelegateSubgroup=argosy-server` the server starts in the leaf:
    the unit's cgroup holds no process and hands the controllers down at once."""
    kernel = StandInKernel(tmp_path / "root", "pids memory cpu")
    unit = kernel.make(kernel.root / "argosy.service", "pids memory cpu")
    kernel.make(unit / SERVER_LEAF, "", str(SERVER))
    folder = kernel.make(unit / "argosy-jobs")
    enabled = enable_controllers(folder, pid=SERVER, write=kernel.write)
    assert enabled.controllers == {"pids", "memory", "cpu"} and enabled.note() is None
    assert (unit / SERVER_LEAF / "cgroup.procs").read_text().split() == [str(SERVER)]


def test_a_server_at_the_hierarchy_s_root_enables_in_place(tmp_path: Path) -> None:
    """The root cgroup may hold processes and hand controllers down (a container whose
    cgroup namespace root is the host's, this CI machine's layout)."""
    kernel = StandInKernel(tmp_path / "root", "pids memory cpu")
    (kernel.root / "cgroup.procs").write_text(f"1 {SERVER}")
    folder = kernel.make(kernel.root / "argosy-jobs")
    enabled = enable_controllers(folder, pid=SERVER, write=kernel.write)
    assert enabled.controllers == {"pids", "memory", "cpu"} and enabled.note() is None
    assert not (kernel.root / SERVER_LEAF).exists()


def test_an_attempt_s_end_is_read_from_its_cgroup_files(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    (tmp_path / "pids.events").write_text("max 5\n")
    (tmp_path / "memory.max").write_text(f"{GIB}\n")
    (tmp_path / "pids.max").write_text("max\n")
    end = read_end(tmp_path)
    assert (end.oom, end.oom_kill, end.pids_max_hits) == (2, 1, 5)
    assert (end.memory_max, end.pids_max) == (GIB, None)
    assert read_end(tmp_path / "gone") == type(end)()


@NEEDS_CGROUPS
def test_an_attempt_starts_unlimited_where_no_controller_can_be_had(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Limits on, and whatever the hierarchy gives: the attempt runs and exits as it
    would; where a controller is missing, one log line names it and why."""
    with caplog.at_level(logging.WARNING, logger="argosy.executors.local"):
        executor = LocalExecutor(LocalOptions(limits=JobLimitsConfig()))
    try:
        assert executor.cgroups is not None
        missing = {"pids", "memory", "cpu"} - executor.cgroups.controllers
        notes = [r.message for r in caplog.records if r.message.startswith("job limits:")]
        assert len(notes) == (1 if missing else 0), notes
        for controller in missing:
            assert controller in notes[0]
        executor.start(command_request(tmp_path, "jun", (sys.executable, "-c", "print(1)")))
        assert wait_exit(executor).exit_code == 0
    finally:
        executor.close()


def test_limits_off_write_nothing_and_say_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="argosy.executors.local"):
        executor = LocalExecutor(LocalOptions(limits=JobLimitsConfig(enabled=False)))
    try:
        assert not [r for r in caplog.records if r.message.startswith("job limits:")]
        if executor.cgroups is not None:
            assert executor.cgroups.controllers == frozenset()
    finally:
        executor.close()


def test_an_attempt_s_limits_are_written_into_its_cgroup(
    limited: JobCgroups, tmp_path: Path
) -> None:
    run = tmp_path / "runs" / "jw"
    limits = PartLimits(memory_bytes=3 * GIB, cpus=1.5, tasks=777).files()
    try:
        limited.make(run, "a1", limits)
        group = limited.path(run, "a1")
        want = {
            "pids": {"pids.max": "777"},
            "memory": {"memory.max": str(3 * GIB)},
            "cpu": {"cpu.max": "150000 100000"},
        }
        for controller in limited.controllers:
            for name, value in want[controller].items():
                assert (group / name).read_text().strip() == value
        if "memory" in limited.controllers and (group / "memory.swap.max").exists():
            assert (group / "memory.swap.max").read_text().strip() == "0"
    finally:
        limited.kill(run)


FORKS = """\
import subprocess, sys
started, refused = [], 0
for _ in range(int(sys.argv[1])):
    try:
        started.append(subprocess.Popen(["sleep", "30"]))
    except OSError:
        refused += 1
for p in started:
    p.kill()
    p.wait()
print(len(started), refused)
"""


def test_a_fork_past_pids_max_fails(limited: JobCgroups, tmp_path: Path) -> None:
    """A fork bomb stops at its attempt's `pids.max`: forks past it fail (EAGAIN), and
    the attempt's end counts them."""
    needs(limited, "pids")
    run = tmp_path / "runs" / "jp"
    try:
        limited.make(run, "a1", {"pids.max": "8"})
        entry = limited.enter(run, "a1")  # (the same cgroup, its limit written)
        proc = subprocess.run(
            [sys.executable, "-c", FORKS, "20"],
            preexec_fn=entry,
            capture_output=True,
            text=True,
            timeout=60,
        )
        entry.close()
        started, refused = map(int, proc.stdout.split())
        assert started <= 7 and refused >= 13, proc.stdout
        assert limited.part_end(run, "a1").pids_max_hits >= refused
    finally:
        limited.kill(run)


HOG = "data = b'x' * (1 << 30); print(len(data))"  # 1 GiB, every page written


@pytest.mark.integration
def test_a_memory_hog_is_killed_at_its_limit_and_its_attempt_failed_saying_so(
    limited: JobCgroups, tmp_path: Path
) -> None:
    """A tiny share (one slot of 100,000) gets the memory floor (128 MiB here); a process
    that writes 1 GiB is OOM-killed, and the attempt is failed, not lost (a new attempt
    would do the same), its reason naming the limit."""
    needs(limited, "memory")
    config = JobLimitsConfig(min_memory_gib=0.125)
    executor = LocalExecutor(LocalOptions(slots=100_000, limits=config))
    try:
        if executor.inventory()[0].chip != "cpu":
            pytest.skip("accelerators found: the share is of them, not of CPU slots")
        executor.start(command_request(tmp_path, "jhog", (sys.executable, "-c", HOG)))
        ended = wait_exit(executor)
        assert ended.exit_code != 0 and not ended.lost
        assert ended.reason.startswith("killed: over its memory limit of 128 MiB"), ended.reason
    finally:
        executor.close()
