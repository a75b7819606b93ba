"""A job user's attempt has a /dev/shm and SysV IPC of its own: it sees none of the host's
(or another tenant's) entries there, and nothing it makes there reaches the host or
outlives it. Started cold and warm, through the real local executor, as a job user."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from launch_requests import command_request, script_request

from argosy.executors.base import LaunchRequest
from argosy.executors.isolation import JobIdentity
from argosy.executors.leftovers import parse_sysvipc
from argosy.executors.limits import JobLimitsConfig
from argosy.executors.local import LocalExecutor, LocalOptions
from argosy.executors.private_shm import available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="job users and namespaces need root"),
    pytest.mark.skipif(not available(), reason="no private mount and IPC namespaces here"),
]

PROBE = """\
import ctypes, os, sys
tag, sentinel = sys.argv[1], sys.argv[2]
print("saw-sentinel" if os.path.exists(f"/dev/shm/{sentinel}") else "no-sentinel")
open(f"/dev/shm/{tag}", "wb").write(b"x" * (1 << 20))
libc = ctypes.CDLL(None, use_errno=True)
print("shmid", libc.shmget(0, 4096, 0o1000 | 0o666), flush=True)
print("own-file" if os.path.exists(f"/dev/shm/{tag}") else "no-own-file", flush=True)
"""


def _shm_ids() -> set[int]:
    return {o.id for o in parse_sysvipc("shm", Path("/proc/sysvipc/shm").read_text())}


def _run(executor: LocalExecutor, request: LaunchRequest) -> str:
    """Start `request`, wait for its end, and return everything its attempt logged."""
    executor.start(request)
    deadline = time.monotonic() + 90
    while request.job_id not in {e.job_id for e in executor.poll()}:
        assert time.monotonic() < deadline, f"{request.job_id} did not end"
        time.sleep(0.05)
    logs = sorted(request.run_dir.rglob("*.log"))
    return "".join(p.read_text(errors="replace") for p in logs)


def test_an_attempt_s_shared_memory_is_its_own_cold_and_warm(open_base: Path) -> None:
    base = f"argosy-s{uuid.uuid4().hex[:6]}"
    identity = JobIdentity.from_settings(run_as=base, per_queue=True, allow_root=False)
    executor = LocalExecutor(
        LocalOptions(identity=identity, warm=True, limits=JobLimitsConfig(private_shm=True))
    )
    sentinel = f"argosy-host-{uuid.uuid4().hex[:8]}"
    Path(f"/dev/shm/{sentinel}").write_text("the host's")
    tags = [f"argosy-shm-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    ids_before = _shm_ids()
    probe = (sys.executable, "-c", PROBE)
    try:
        for job_id, tag in zip(("jcold", "jlaunch", "jwarm"), tags, strict=True):
            if job_id == "jcold":  # a command of its own: always cold
                request = command_request(open_base, job_id, (*probe, tag, sentinel), "qa")
            else:  # `argosy launch`: the user's warm process takes the second one
                request = script_request(open_base, job_id, PROBE, (tag, sentinel), "qa")
            warm = executor._warm.get(identity.for_queue("qa"))
            waiting = warm._proc.pid if warm is not None else None
            out = _run(executor, request)
            if job_id != "jcold":  # the user's warm process became this attempt
                wrapper = request.run_dir / "server" / "attempt1" / "wrapper.pid"
                assert waiting is not None and int(wrapper.read_text()) == waiting
            assert "no-sentinel" in out and "own-file" in out, out
            assert int(out.split("shmid", 1)[1].split()[0]) >= 0, out
            assert not Path(f"/dev/shm/{tag}").exists()  # never on the host's
            assert _shm_ids() <= ids_before  # its segment went with its namespace
    finally:
        executor.close()
        Path(f"/dev/shm/{sentinel}").unlink(missing_ok=True)
        for queue in ("qa",):
            subprocess.run(["userdel", f"{base}-{queue}"], capture_output=True)
            subprocess.run(["groupdel", f"{base}-{queue}"], capture_output=True)
