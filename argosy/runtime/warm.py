"""Warm standby ranks: processes that already imported torch, waiting for their assignment.

A restart spends most of its time in `import torch` and in what DDP imports on first use
(`torch._dynamo`), seconds that do not depend on the job. The agent starts one standby
per local rank while an attempt trains; on a restart each standby reads one JSON line on
stdin, `{"env", "argv", "cwd", "log"}`, points stdout and stderr at the rank's log,
takes the rank's environment and runs the script as `__main__`. A standby whose stdin
closes exits quietly.

    proc = start_standby(env)                  # agent, while the attempt runs
    assign(proc, env=..., argv=[script, ...], cwd=..., log=...)   # at restart
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")


def start_standby(env: dict[str, str]) -> subprocess.Popen:
    """A standby process that imports the heavy modules now and waits for work."""
    return subprocess.Popen(
        [sys.executable, "-m", "argosy.runtime.warm"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def assign(proc: subprocess.Popen, *, env: dict, argv: list[str], cwd: str, log: Path) -> bool:
    """Hand a standby its rank; False if it is gone (the caller then starts one cold)."""
    if proc.poll() is not None or proc.stdin is None:
        return False
    job = {"env": env, "argv": argv, "cwd": cwd, "log": str(log)}
    try:
        proc.stdin.write((json.dumps(job) + "\n").encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        return False
    return True


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a module this torch lacks: the script imports what it needs
            continue


def main() -> int:
    _preload()
    line = sys.stdin.readline()
    if not line:
        return 0
    job = json.loads(line)
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    script = job["argv"][0]
    sys.argv = list(job["argv"])
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
