"""A job user's processes start under one set of rlimits whichever way they start: cold
(`prlimit` before the user switch) or as a warm launcher's waiting process, which becomes
the attempt in place; RLIMIT_FSIZE included on both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from argosy.executors.base import LaunchRequest
from argosy.executors.isolation import JobIdentity
from argosy.executors.limits import GIB, JobLimitsConfig, Rlimits
from argosy.executors.local import LocalExecutor, LocalOptions, with_job_limits

NEEDS_PRLIMIT = pytest.mark.skipif(shutil.which("prlimit") is None, reason="no prlimit")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
READ = (
    "import resource as r; print(*(r.getrlimit(getattr(r, 'RLIMIT_' + n))[0]"
    " for n in ('NPROC', 'NOFILE', 'FSIZE')))"
)


@NEEDS_PRLIMIT
def test_a_cold_start_gets_the_file_size_limit_too() -> None:
    rlimits = Rlimits(nproc=1234, nofile=4321, fsize=3 * GIB)
    argv = with_job_limits([sys.executable, "-c", READ], user=object(), rlimits=rlimits)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1234", "4321", str(3 * GIB)]


def limits_of(pid: int) -> dict[str, str]:
    """Soft limits from /proc/<pid>/limits, by name ("Max processes": "1234")."""
    found = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]:
        name, soft = line[:26].strip(), line[26:].split()[0]
        found[name] = soft
    return found


def waiting_python(wrapper: int, timeout_s: float = 30) -> int:
    """The warm process under its wrapper, once `prlimit` and `setpriv` have exec'd it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
        for child in map(int, children):
            try:
                line = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if line.split(b"\0")[0] == sys.executable.encode():  # past prlimit and setpriv
                return child
        time.sleep(0.02)
    raise AssertionError("no waiting warm process")


@NEEDS_PRLIMIT
@ROOT_ONLY
@pytest.mark.integration
def test_a_job_user_s_warm_process_waits_under_the_job_s_rlimits(tmp_path: Path) -> None:
    """The executor's next attempt of a queue starts from a waiting process of the queue's
    user: that process already has the rlimits a cold start sets (it becomes the attempt
    in place), from the same config."""
    base = f"argosy-r{uuid.uuid4().hex[:6]}"
    identity = JobIdentity.from_settings(run_as=base, per_queue=True, allow_root=False)
    config = JobLimitsConfig(max_file_size_gib=3)
    executor = LocalExecutor(LocalOptions(warm=True, identity=identity, limits=config))
    try:
        request = LaunchRequest(
            job_id="jr1",
            attempt=1,
            script="",
            args=(),
            nproc_per_node=1,
            run_dir=tmp_path / "runs" / "jr1",
            nodes={"h": 1},
            chip="cpu",
            command=("true",),
            queue="qa",
        )
        executor.start(request)  # cold; the queue's next one would start warm
        user = identity.for_queue("qa")
        warm = executor._warm[user]  # noqa: SLF001  # the waiting process under test
        pid = waiting_python(warm._proc.pid)  # noqa: SLF001
        got = limits_of(pid)
        want = executor.rlimits
        assert want.fsize == 3 * GIB
        assert got["Max processes"] == str(want.nproc)
        assert got["Max open files"] == str(want.nofile)
        assert got["Max file size"] == str(want.fsize)
        assert os.stat(f"/proc/{pid}").st_uid == user.uid  # (the job's user)
    finally:
        executor.close()
        subprocess.run(["userdel", f"{base}-qa"], capture_output=True)
        subprocess.run(["groupdel", f"{base}-qa"], capture_output=True)
