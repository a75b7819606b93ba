"""Admission: what the spec's types cannot say about whether a job can ever run here.

`JobSpec` checks shapes and ranges; this module checks the job against the server's
filesystem and operating system before it is stored, so a job that could never start
is refused at submit (422) instead of failing later with "the launcher exited 2":

- `workdir`: given, absolute, an existing directory the job's user may enter;
- `script`: exists, is a regular file the job's user can read (`readable`, which the
  control plane answers for the user jobs run as), a `.py` file or executable, and a
  relative script stays inside its workdir (no `../../etc/passwd`);
- `args`: each argument under the kernel's MAX_ARG_STRLEN, and the command line plus a
  margin for the environment under `ARG_MAX` (else exec fails: Argument list too long).

Each problem is one FastAPI-style field error, so the API and the console say the same:

    errors = job_errors(spec, readable=os_readable)
    # [{"loc": ["body", "script"], "msg": "script '/x/t.py' does not exist", "type": ...}]
    refuse_unless_runnable(spec, readable)   # raises HTTPException(422, errors) if any
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException

from argosy.server.spec import JobSpec

MAX_ARG_STRLEN = 131072
"""Linux's limit on one argument or environment string (32 pages), in bytes."""
ENV_MARGIN_BYTES = 64 << 10
"""Room kept for the job's environment and the launcher's own arguments within ARG_MAX."""

FieldError = dict[str, Any]
Readable = Callable[[str], bool]


def os_readable(path: str) -> bool:
    """Whether this process may read `path` (a directory: enter it); what
    `Control.readable` answers for jobs that run as the server's own user."""
    return os.access(path, os.X_OK if os.path.isdir(path) else os.R_OK)


def job_errors(spec: JobSpec, readable: Readable = os_readable) -> list[FieldError]:
    """Every reason `spec` can never run on this host (empty: it may)."""
    texts = {"workdir": [spec.workdir or ""], "script": [spec.script], "args": spec.args}
    errors = [e for field, values in texts.items() if (e := _text_error(field, values))]
    if errors:
        return errors  # nothing below could even name such a path
    errors = _workdir_errors(spec.workdir, readable)
    if not errors or os.path.isabs(spec.script):
        errors += _script_errors(spec.script, spec.workdir or "/", readable)
    return errors + _args_errors(spec.script, spec.args)


def refuse_unless_runnable(spec: JobSpec, readable: Readable = os_readable) -> None:
    """Raise a 422 whose detail lists the field errors, if `spec` can never run."""
    errors = job_errors(spec, readable)
    if errors:
        raise HTTPException(422, errors)


def _error(field: str, msg: str, kind: str) -> FieldError:
    return {"loc": ["body", field], "msg": msg, "type": kind}


def _text_error(field: str, values: list[str]) -> FieldError | None:
    """A NUL byte or a lone surrogate cannot be part of a path or an argument."""
    for value in values:
        try:
            encoded = os.fsencode(value)
        except UnicodeError:
            return _error(field, "holds characters no path or argument can hold", "bad_text")
        if b"\0" in encoded:
            return _error(field, "holds a NUL byte", "bad_text")
    return None


def _workdir_errors(workdir: str | None, readable: Readable) -> list[FieldError]:
    if not workdir:
        msg = "required: the directory the job runs in, as an absolute path on the server"
        return [_error("workdir", msg, "missing")]
    if not os.path.isabs(workdir):
        msg = f"workdir '{workdir}' is relative; give an absolute path on the server"
        return [_error("workdir", msg, "workdir_relative")]
    if not os.path.isdir(workdir):
        return [_error("workdir", f"workdir '{workdir}' is not a directory", "workdir_missing")]
    if not readable(workdir):
        msg = f"workdir '{workdir}' cannot be entered by the user jobs run as"
        return [_error("workdir", msg, "workdir_unreadable")]
    return []


def _script_errors(script: str, workdir: str, readable: Readable) -> list[FieldError]:
    path = os.path.normpath(os.path.join(workdir, script))
    if not os.path.isabs(script) and not _inside(path, workdir):
        msg = f"script '{script}' climbs out of its workdir '{workdir}'"
        return [_error("script", msg, "script_outside_workdir")]
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as err:
        what = "does not exist" if isinstance(err, FileNotFoundError) else f"cannot be read: {err}"
        return [_error("script", f"script '{path}' {what}", "script_missing")]
    if not stat.S_ISREG(mode):
        return [_error("script", f"script '{path}' is not a regular file", "script_not_file")]
    if not readable(path):
        msg = f"script '{path}' is not readable by the user jobs run as"
        return [_error("script", msg, "script_unreadable")]
    if not path.endswith(".py") and not mode & 0o111:
        msg = f"script '{path}' is neither a .py file nor executable"
        return [_error("script", msg, "script_not_executable")]
    return []


def _inside(path: str, folder: str) -> bool:
    folder = os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _args_errors(script: str, args: list[str]) -> list[FieldError]:
    for i, arg in enumerate(args):
        size = len(os.fsencode(arg))
        if size >= MAX_ARG_STRLEN:
            msg = f"argument {i} is {size} bytes; one may be at most {MAX_ARG_STRLEN - 1}"
            return [_error("args", msg, "arg_too_long")]
    total = sum(len(os.fsencode(a)) + 1 for a in [script, *args])
    limit = _arg_max() - ENV_MARGIN_BYTES
    if total > limit:
        msg = (
            f"the arguments take {total} bytes; this host allows {limit} "
            "(ARG_MAX less room for the environment)"
        )
        return [_error("args", msg, "args_too_long")]
    return []


def _arg_max() -> int:
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        value = -1
    return value if value > 0 else 2 << 20
