"""Warm standby ranks: processes that already imported torch, waiting for their assignment.

A restart spends most of its time in `import torch` and in what DDP imports on first use
(`torch._dynamo`), seconds that do not depend on the job. The agent starts one standby
per local rank while an attempt trains; on a restart each standby reads one JSON line on
stdin, `{"env", "argv", "cwd", "log"}`, points stdout and stderr at the rank's log,
takes the rank's environment and runs the script as `__main__`. A standby whose stdin
closes exits quietly. Told first (`prewarm_persister`, once the attempt it may replace has
taken flash checkpoints), it also starts that rank's checkpoint persister ahead, which
the restarted rank's checkpointer adopts (argosy/checkpoint/standby.py): its first saves
then do not wait for a persister importing torch.

On a GPU the rest of a restart is mostly CUDA's own start (the device's context). A
standby started with `ARGOSY_WARM_CUDA=<index>` (the agent sets it from the device the
rank it may replace works on) creates that device's context too, and nothing else: no
allocator, no cuBLAS, whose settings the script may still choose. Should the rank's
environment then name other visible devices than the standby started with, the context
would be for the wrong ones: the standby runs the script in a fresh interpreter instead.

    proc = start_standby(env)                  # agent, while the attempt runs
    assign(proc, env=..., argv=[script, ...], cwd=..., log=...)   # at restart
"""

from __future__ import annotations

import json
import os
import queue
import runpy
import subprocess
import sys
import threading
from pathlib import Path

from argosy.core.procs import tell

PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")
ENV_CUDA = "ARGOSY_WARM_CUDA"
"""The CUDA device index whose context a standby creates while it waits."""
VISIBLE = "CUDA_VISIBLE_DEVICES"


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
    return tell(proc, {"env": env, "argv": argv, "cwd": cwd, "log": str(log)}, last=True)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a module this torch lacks: the script imports what it needs
            continue


def warm_cuda(device: str | None) -> bool:
    """Create CUDA's context on `device` (an index); False when there is none to make."""
    if not device:
        return False
    try:
        from argosy.hardware.backends import cuda

        cuda.start_context(int(device))
    except Exception:  # no such device, no CUDA here: the script starts it itself
        return False
    return True


def prewarm_persister(proc: subprocess.Popen) -> bool:
    """Tell a standby to start its checkpoint persister ahead (the attempt it may replace
    takes flash checkpoints); False if it is gone."""
    return tell(proc, {"prewarm": "persister"}, last=False)


def _read_orders(inbox: queue.Queue[dict | None]) -> None:
    """Stdin, on a thread of its own: a persister asked for starts at once, beside the
    heavy imports; the assignment (None once stdin closes without one) goes to `inbox`."""
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("prewarm") != "persister":
            inbox.put(dict(message))
            return
        from argosy.checkpoint import standby

        if not standby.waiting():
            standby.start()
    inbox.put(None)


def main() -> int:
    inbox: queue.Queue[dict | None] = queue.Queue()
    threading.Thread(target=_read_orders, args=(inbox,), daemon=True).start()
    _preload()
    warmed = warm_cuda(os.environ.get(ENV_CUDA))
    visible = os.environ.get(VISIBLE)
    job = inbox.get()
    if job is None:
        return 0
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.chdir(job["cwd"])
    if warmed and job["env"].get(VISIBLE) != visible:  # our context is for other devices
        os.execve(sys.executable, [sys.executable, *job["argv"]], job["env"])
    os.environ.clear()
    os.environ.update(job["env"])
    script = job["argv"][0]
    sys.argv = list(job["argv"])
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
