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
from launch_requests import command_request

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


def _run(executor: LocalExecutor, base: Path, job_id: str, tag: str, sentinel: str) -> str:
    request = command_request(base, job_id, (sys.executable, "-c", PROBE, tag, sentinel), "qa")
    executor.start(request)
    deadline = time.monotonic() + 60
    while job_id not in {e.job_id for e in executor.poll()}:
        assert time.monotonic() < deadline, f"{job_id} did not end"
        time.sleep(0.05)
    return (request.run_dir / "server" / "attempt1" / "output.log").read_text()


def test_an_attempt_s_shared_memory_is_its_own_cold_and_warm(open_base: Path) -> None:
    base = f"argosy-s{uuid.uuid4().hex[:6]}"
    identity = JobIdentity.from_settings(run_as=base, per_queue=True, allow_root=False)
    executor = LocalExecutor(
        LocalOptions(identity=identity, warm=True, limits=JobLimitsConfig(private_shm=True))
    )
    sentinel = f"argosy-host-{uuid.uuid4().hex[:8]}"
    Path(f"/dev/shm/{sentinel}").write_text("the host's")
    tags = [f"argosy-shm-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    ids_before = _shm_ids()
    try:
        for job_id, tag in zip(("jcold", "jwarm"), tags, strict=True):  # the second warm
            out = _run(executor, open_base, job_id, tag, sentinel)
            assert "no-sentinel" in out and "own-file" in out, out
            shmid = int(out.split("shmid", 1)[1].split()[0])
            assert shmid >= 0, out
            assert not Path(f"/dev/shm/{tag}").exists()  # never on the host's
            assert _shm_ids() <= ids_before  # its segment went with its namespace
    finally:
        executor.close()
        Path(f"/dev/shm/{sentinel}").unlink(missing_ok=True)
        for queue in ("qa",):
            subprocess.run(["userdel", f"{base}-{queue}"], capture_output=True)
            subprocess.run(["groupdel", f"{base}-{queue}"], capture_output=True)
