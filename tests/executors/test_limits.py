"""An attempt's part of its machine: limits from its devices' share (positive, monotone in
the share, a full node's sum within the host less the headroom, floors for tiny shares),
the rlimits of job users' processes, and how an exit is told once the limits ended it."""

from __future__ import annotations

import resource

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.executors.base import AttemptExit
from argosy.executors.cgroup_controllers import Enabled, parse_counters
from argosy.executors.limits import (
    CPU_PERIOD_US,
    GIB,
    MAX_CPU_WEIGHT,
    MIN_CPUS,
    MIN_MEMORY_BYTES,
    MIN_TASKS,
    HostSize,
    JobLimitsConfig,
    PartEnd,
    explain_exit,
    folder_limits,
    job_rlimits,
    part_limits,
    share_of,
)

HOSTS = st.builds(
    HostSize,
    memory_bytes=st.integers(1 << 28, 1 << 42),  # 256 MiB .. 4 TiB
    cpus=st.floats(1, 512),
    tasks=st.integers(1024, 1 << 22),
)
CONFIGS = st.builds(
    JobLimitsConfig,
    headroom_fraction=st.floats(0, 0.9),
    min_memory_gib=st.floats(0, 16),
)


@given(host=HOSTS, config=CONFIGS, devices=st.integers(1, 64), data=st.data())
def test_limits_are_positive_and_grow_with_the_share(
    host: HostSize, config: JobLimitsConfig, devices: int, data: st.DataObject
) -> None:
    a = data.draw(st.integers(0, devices), label="fewer")
    b = data.draw(st.integers(a, devices), label="more")
    small = part_limits(share_of(a, devices), host, config)
    big = part_limits(share_of(b, devices), host, config)
    whole = folder_limits(host, config)
    for got in (small, big):
        assert got.memory_bytes > 0 and got.cpus > 0 and got.tasks > 0
        assert got.memory_bytes <= whole.memory_bytes and got.cpus <= whole.cpus
        assert got.tasks <= whole.tasks
    assert small.memory_bytes <= big.memory_bytes
    assert small.cpus <= big.cpus and small.tasks <= big.tasks


@given(host=HOSTS, config=CONFIGS, parts=st.lists(st.integers(1, 16), min_size=1, max_size=16))
def test_a_full_node_never_gets_more_than_the_host_less_its_headroom(
    host: HostSize, config: JobLimitsConfig, parts: list[int]
) -> None:
    """Attempts that split a node's devices between them: the limits from their shares
    add up to at most what jobs may have together; a part held up by a floor may add
    at most its floor, and the folder's own cap (the kernel's, over all of them) is
    exactly that whole."""
    devices = sum(parts)
    whole = folder_limits(host, config)
    keep = 1 - config.headroom_fraction
    assert whole.memory_bytes <= host.memory_bytes * keep + 1
    assert whole.cpus <= host.cpus * keep + 1e-9 and whole.tasks <= host.tasks * keep + 1
    got = [part_limits(share_of(d, devices), host, config) for d in parts]
    floor_bytes = max(MIN_MEMORY_BYTES, int(config.min_memory_gib * GIB))
    floored = sum(1 for d in parts if d / devices * whole.memory_bytes < floor_bytes)
    assert sum(g.memory_bytes for g in got) <= whole.memory_bytes + floored * floor_bytes
    if not floored:
        assert sum(g.memory_bytes for g in got) <= whole.memory_bytes
    cpus_floored = sum(1 for d in parts if d / devices * whole.cpus < MIN_CPUS)
    assert sum(g.cpus for g in got) <= whole.cpus + cpus_floored * MIN_CPUS + 1e-6
    weights = [int(g.files()["cpu.weight"]) for g in got]  # a weight each, never a cap
    assert all(1 <= w <= MAX_CPU_WEIGHT for w in weights)
    assert not any("cpu.max" in g.files() for g in got)
    if not cpus_floored:  # under contention the CPUs go as the devices do
        assert all(
            abs(w / sum(weights) - d / sum(parts)) <= len(parts) / sum(weights) + 1e-9
            for w, d in zip(weights, parts, strict=True)
        )
    assert "cpu.max" in whole.files()  # the jobs together are capped
    tasks_floored = sum(1 for d in parts if d / devices * whole.tasks < MIN_TASKS)
    assert sum(g.tasks for g in got) <= whole.tasks + tasks_floored * MIN_TASKS


@pytest.mark.parametrize(
    ("devices", "host_devices", "want_memory_gib", "want_cpus"),
    [(1, 8, 28.8, 14.4), (8, 8, 230.4, 115.2), (1, 1000, 4.0, 1.0)],
    ids=["one-of-eight", "whole-node", "tiny-share-floored"],
)
def test_an_attempt_s_limits_on_a_known_host(
    devices: int, host_devices: int, want_memory_gib: float, want_cpus: float
) -> None:
    host = HostSize(memory_bytes=256 * GIB, cpus=128, tasks=1 << 20)
    got = part_limits(share_of(devices, host_devices), host, JobLimitsConfig())
    assert got.memory_bytes / GIB == pytest.approx(want_memory_gib, abs=0.01)
    assert got.cpus == pytest.approx(want_cpus)
    files = got.files()
    assert files["memory.swap.max"] == "0" and files["pids.max"] == str(got.tasks)
    assert files["cpu.weight"] == str(round(want_cpus / (128 * 0.9) * MAX_CPU_WEIGHT))
    whole = folder_limits(host, JobLimitsConfig()).files()
    assert whole["cpu.max"] == f"{int(128 * 0.9 * CPU_PERIOD_US)} {CPU_PERIOD_US}"


def test_a_floor_never_exceeds_what_jobs_may_have_together() -> None:
    host = HostSize(memory_bytes=2 * GIB, cpus=0.5, tasks=2048)
    got = part_limits(0.01, host, JobLimitsConfig(min_memory_gib=16))
    whole = folder_limits(host, JobLimitsConfig())
    assert got.memory_bytes == whole.memory_bytes and got.cpus == whole.cpus
    assert got.tasks == whole.tasks


def test_rlimits_are_one_set_within_the_hard_limits() -> None:
    def hard(which: int) -> tuple[int, int]:
        return {resource.RLIMIT_NPROC: (100, 100)}.get(which, (-1, resource.RLIM_INFINITY))

    got = job_rlimits(JobLimitsConfig(max_file_size_gib=2), hard)
    assert (got.nproc, got.nofile, got.fsize) == (100, 65536, 2 * GIB)
    assert got.prlimit_args() == ["--nproc=100", "--nofile=65536", f"--fsize={2 * GIB}"]
    assert job_rlimits(JobLimitsConfig(max_file_size_gib=0), hard).fsize is None
    assert "--fsize=unlimited" in job_rlimits(JobLimitsConfig(max_file_size_gib=0)).prlimit_args()


def exit_(code: int | None) -> AttemptExit:
    from argosy.executors.base import describe_exit, is_lost

    return AttemptExit("j", 1, code, is_lost(code), describe_exit(code))


@pytest.mark.parametrize(
    ("code", "end", "want_lost", "want_reason"),
    [
        (
            137,
            PartEnd(oom=1, oom_kill=1, memory_max=4 * GIB),
            False,
            "killed: over its memory limit of 4.0 GiB (the kernel ended 1 of its processes;"
            " the launcher was killed by SIGKILL (exit 137))",
        ),
        (
            1,
            PartEnd(oom=3, oom_kill=2, memory_max=128 << 20),
            False,
            "killed: over its memory limit of 128 MiB (the kernel ended 2 of its processes;"
            " the launcher exited 1)",
        ),
        (None, PartEnd(oom=1, oom_kill=1, memory_max=GIB), False, "killed: over its memory"),
        (0, PartEnd(oom=1, oom_kill=1, memory_max=GIB), False, "exited 0"),
        (137, PartEnd(oom_kill=1), True, "the host ran short of memory"),
        (1, PartEnd(pids_max_hits=5, pids_max=64), False, "its limit of 64 processes"),
        (153, PartEnd(), True, "(exit 153)"),  # as the job itself exited: told as is
        (137, PartEnd(), True, "the launcher was killed by SIGKILL (exit 137)"),
    ],
    ids=[
        "oom-launcher",
        "oom-rank",
        "oom-wrapper",
        "oom-survived",
        "host-oom",
        "pids",
        "exit-153-is-the-job-s",
        "plain",
    ],
)
def test_an_exit_says_which_limit_ended_it(
    code: int | None, end: PartEnd, want_lost: bool, want_reason: str
) -> None:
    got = explain_exit(exit_(code), end)
    assert got.lost == want_lost
    assert got.reason.startswith(want_reason) or want_reason in got.reason, got.reason
    assert got.exit_code == code


def test_cgroup_counters_are_parsed_and_missing_controllers_said_in_one_line() -> None:
    text = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"
    assert parse_counters(text) == {
        "low": 0,
        "high": 0,
        "max": 12,
        "oom": 1,
        "oom_kill": 1,
        "oom_group_kill": 0,
    }
    assert Enabled(frozenset(CONTROLLER for CONTROLLER in ("pids",))).note() is None
    note = Enabled(frozenset(), {"memory": "not given", "cpu": "busy"}).note()
    assert note is not None and "\n" not in note
    assert note.startswith("job limits: attempts run without the cpu, memory limits")
