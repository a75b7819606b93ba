"""A job run as a job user gets RLIMIT_NPROC and RLIMIT_NOFILE set before the user
switch: a fork bomb stops at its own limit, not the host's."""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys

import pytest

from argosy.executors.limits import JOB_MAX_OPEN_FILES, JOB_MAX_PROCESSES
from argosy.executors.local import with_job_limits


def test_a_job_users_command_runs_under_the_limits() -> None:
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    code = (
        "import resource as r; print(r.getrlimit(r.RLIMIT_NPROC)[0], *r.getrlimit(r.RLIMIT_NOFILE))"
    )
    argv = with_job_limits([sys.executable, "-c", code], user=object())
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    nproc = _within(resource.RLIMIT_NPROC, JOB_MAX_PROCESSES)
    nofile = _within(resource.RLIMIT_NOFILE, JOB_MAX_OPEN_FILES)
    assert out == [str(nproc), str(nofile), str(nofile)]


def _within(which: int, wanted: int) -> int:
    _, hard = resource.getrlimit(which)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def test_a_job_of_the_servers_own_user_is_left_as_it_is() -> None:
    assert with_job_limits(["true"], user=None) == ["true"]
