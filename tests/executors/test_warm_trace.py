"""A warm launcher's waiting process that a tracer reached before it made itself
non-dumpable is never handed an attempt: `take` kills it and says to start cold, and the
next waiting process, untraced, is used. The status parsing runs everywhere; the real
tracer (PTRACE_SEIZE as the waiting process's own uid, root here) needs ptrace rights."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from argosy.core.procs import pid_alive
from argosy.executors.isolation import attempt_records
from argosy.executors.warm_launcher import WARM_COMMAND, WarmLauncher, _field

REPO = Path(__file__).resolve().parents[2]
STATUS = "Name:\tpython3.11\nUmask:\t0022\nState:\tS (sleeping)\nPPid:\t{}\nTracerPid:\t{}\n"

SEIZE = """\
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
ok = libc.ptrace(0x4206, int(sys.argv[1]), None, None) == 0  # PTRACE_SEIZE
print("seized" if ok else f"refused {ctypes.get_errno()}", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("text", "name", "want"),
    [
        (STATUS.format(10, 0), "TracerPid", "0"),
        (STATUS.format(10, 4242), "TracerPid", "4242"),
        (STATUS.format(10, 0), "PPid", "10"),
        ("Name:\tx\n", "TracerPid", None),
    ],
    ids=["untraced", "traced", "parent", "no-line"],
)
def test_a_status_field_is_read_by_its_name(text: str, name: str, want: str | None) -> None:
    assert _field(text, name) == want


def waiting_process(wrapper: int, timeout_s: float = 30) -> int:
    """The warm process under its wrapper once it runs the warm module and has made
    itself non-dumpable (its /proc files root's), found without its wrapper's help."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                status = (entry / "status").read_text()
                command = (entry / "cmdline").read_bytes().decode().split("\0")
                owner = (entry / "status").stat().st_uid
            except (OSError, NotADirectoryError):
                continue
            running = command[: len(WARM_COMMAND)] == WARM_COMMAND
            if _field(status, "PPid") == str(wrapper) and running and owner == 0:
                return int(entry.name)
        time.sleep(0.02)
    raise AssertionError("no waiting warm process")


@pytest.mark.skipif(os.geteuid() != 0, reason="seizing a non-dumpable process needs root")
def test_a_traced_waiting_process_is_killed_and_the_attempt_starts_cold(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
    warm = WarmLauncher(env)  # the server's own user (root), no cgroups
    tracer = None
    try:
        pid = waiting_process(warm._proc.pid)  # noqa: SLF001  # the process under test
        tracer = subprocess.Popen(
            [sys.executable, "-c", SEIZE, str(pid)], stdout=subprocess.PIPE, text=True
        )
        assert tracer.stdout is not None
        said = tracer.stdout.readline().strip()
        if said != "seized":
            pytest.skip(f"this host does not let root trace it: {said}")
        where = tmp_path / "attempt1"
        attempt_records(where, None)
        assert warm.take(["--version"], env, None, where) is None  # start cold
        deadline = time.monotonic() + 10
        while pid_alive(pid):
            assert time.monotonic() < deadline, "the traced process still runs"
            time.sleep(0.02)
        assert not (where / "launch.pid").exists()  # it heard of no attempt

        again = tmp_path / "attempt2"
        attempt_records(again, None)
        proc = warm.take(["--version"], env, None, again)  # the next one is untraced
        assert proc is not None and proc.wait(timeout=60) == 0
        assert (again / "output.log").read_text().strip()
    finally:
        warm.close()
        if tracer is not None:
            tracer.kill()
            tracer.wait()
