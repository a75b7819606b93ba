"""A warm `argosy` process: started before its attempt is known, it imports the CLI (most
of `argosy launch`'s start-up) and then waits for one request on a pipe.

The local executor keeps one warm process ready. When an attempt starts, it writes one
JSON line to the pipe: the argv after `argosy`, the job's whole environment, the working
directory and the output file. The process applies them and runs the command in place,
so the attempt skips the imports (a second or more on a loaded machine). EOF on the pipe
(the executor closed or died) ends it quietly. It is not dumpable: a job of the same
user cannot attach to it while it waits (the executor hands an attempt only to one that
has made itself so and has no tracer: one could attach before that first step).

    python -m argosy.executors.warm --fd 7    # the executor's side: warm_launcher.WarmLauncher
"""

from __future__ import annotations

import importlib
import json
import os
import sys

PR_SET_DUMPABLE = 4


def serve_one(fd: int) -> None:
    """Import the CLI, wait for the request on `fd`, then become that command."""
    not_dumpable()
    # The `argosy` command's entry point, as `python -m argosy` runs it: the executor
    # depends on the command (as for every attempt), not on the cli package's code.
    main = importlib.import_module("argosy.__main__").main  # the slow part, done ahead

    with os.fdopen(fd, "rb") as pipe:
        line = pipe.readline()
    if not line.strip():
        return
    request = json.loads(line)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    os.environ.clear()  # the job's environment, nothing else (it started with the allowed part)
    os.environ.update(request["env"])
    out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.argv = ["argosy", *request["argv"]]
    main()


def not_dumpable() -> None:
    """`prctl(PR_SET_DUMPABLE, 0)`: no process of the same user may attach to this one
    (ptrace) while it waits, nor read its memory, to run code in it before its attempt
    is known (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


if __name__ == "__main__":
    serve_one(int(sys.argv[sys.argv.index("--fd") + 1]))
