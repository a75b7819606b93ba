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

No oracle: the server may run as root, and a submitter must not learn through it what
exists in places the job's user cannot look (another tenant's run directory). So a path
is first looked up as the job's user would (`reachable`: one component at a time, links
followed as the kernel does, each directory searched only once `readable` says the job's
user may enter it); a path that user could not look up gets one answer whatever lies
there, missing, unreadable or of the wrong type alike ("not found or not readable by the
job's user", type `<field>_unreachable`). The detailed reasons (does not exist, not a
regular file, not readable, not a directory) are given only where that user could have
found them out itself.

Each problem is one FastAPI-style field error, so the API and the console say the same:

    errors = job_errors(spec, readable=os_readable)
    # [{"loc": ["body", "script"], "msg": "script '/x/t.py' does not exist", "type": ...}]
    refuse_unless_runnable(spec, readable)   # raises HTTPException(422, errors) if any
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException

from argosy.executors.isolation import user_name_for
from argosy.server.spec import JobSpec

MAX_ARG_STRLEN = 131072
"""Linux's limit on one argument or environment string (32 pages), in bytes."""
ENV_MARGIN_BYTES = 64 << 10
"""Room kept for the job's environment and the launcher's own arguments within ARG_MAX."""

MAX_SYMLINKS = 40
"""Links followed in one lookup before it fails (Linux's ELOOP limit)."""

FieldError = dict[str, Any]
Readable = Callable[[str], bool]


def os_readable(path: str) -> bool:
    """Whether this process may read `path` (a directory: enter it); what
    `Control.readable` answers for jobs that run as the server's own user."""
    return os.access(path, os.X_OK if os.path.isdir(path) else os.R_OK)


def job_errors(
    spec: JobSpec, readable: Readable = os_readable, user: str | None = None
) -> list[FieldError]:
    """Every reason `spec` can never run on this host (empty: it may). `user`: the name
    of the job's user for messages (default: what `job_user_name` finds)."""
    texts = {"workdir": [spec.workdir or ""], "script": [spec.script], "args": spec.args}
    errors = [e for field, values in texts.items() if (e := _text_error(field, values))]
    if errors:
        return errors  # nothing below could even name such a path
    who = user or (job_user_name(None, spec.queue) if readable is os_readable else None)
    errors = _workdir_errors(spec.workdir, readable, who)
    if not errors or os.path.isabs(spec.script):
        errors += _script_errors(spec.script, spec.workdir or "/", readable, who)
    return errors + _args_errors(spec.script, spec.args)


def refuse_unless_runnable(
    spec: JobSpec, readable: Readable = os_readable, user: str | None = None
) -> None:
    """Raise a 422 whose detail lists the field errors, if `spec` can never run."""
    errors = job_errors(spec, readable, user)
    if errors:
        raise HTTPException(422, errors)


def job_user_name(identity: Any, queue: str | None) -> str | None:
    """The name of the user a job of `queue` runs as: the executor's `identity` names a
    root server's job users (`JobIdentity`); without one, jobs run as this process's
    user. None: not known."""
    if getattr(identity, "active", False):
        return user_name_for(identity.base, queue if identity.per_queue else None)
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None


def reachable(
    path: str,
    readable: Readable,
    lstat: Callable[[str], os.stat_result] = os.lstat,
    readlink: Callable[[str], str] = os.readlink,
) -> bool:
    """Whether the job's user could look up the absolute `path` at all (what it names may
    still be missing or unreadable: the user could find that out itself).

    The lookup goes as the kernel's does for that user, one component at a time with
    links followed (at most `MAX_SYMLINKS`), and asks `readable(d)` (may the user enter
    `d`, reaching it from /) before anything looked up in a directory `d` counts: a link
    followed, a name missing, a non-directory, the end. `readable` is only ever asked of
    directories reached through real directories (never through a link), so neither
    this lookup nor `readable` follows a link through a place the user cannot search. A
    real directory passed on the way needs no question of its own: a deeper one's answer
    covers every directory above it. As root, `lstat` sees everything; what it finds
    decides nothing unless the user could have seen it too."""
    pending = list(reversed(path.split("/")))
    current, hops = "/", 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if not readable(current):
                return False
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            info = lstat(candidate)
        except (OSError, ValueError):  # missing (the user may learn it if it may search)
            return readable(current)
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if not readable(current):
                return False
            if hops > MAX_SYMLINKS:
                return True  # the user meets the same loop (ELOOP)
            try:
                target = readlink(candidate)
            except (OSError, ValueError):
                return True  # gone since: the checks below say what is there now
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed(target.split("/")))
        elif stat.S_ISDIR(info.st_mode):
            current = candidate
        else:  # a file: the end, or names after it (ENOTDIR)
            return readable(current)
    return current == "/" or readable(current) or readable(os.path.dirname(current))


def _unreachable(field: str, path: str, user: str | None) -> FieldError:
    """The one answer for a path the job's user cannot look up, whatever lies there."""
    who = f"the job's user '{user}'" if user else "the user jobs run as"
    msg = f"{field} '{path}' is not found or not readable by {who}"
    return _error(field, msg, f"{field}_unreachable")


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


def _workdir_errors(workdir: str | None, readable: Readable, who: str | None) -> list[FieldError]:
    if not workdir:
        msg = "required: the directory the job runs in, as an absolute path on the server"
        return [_error("workdir", msg, "missing")]
    if not os.path.isabs(workdir):
        msg = f"workdir '{workdir}' is relative; give an absolute path on the server"
        return [_error("workdir", msg, "workdir_relative")]
    if not reachable(workdir, readable):
        return [_unreachable("workdir", workdir, who)]
    if not os.path.isdir(workdir):
        return [_error("workdir", f"workdir '{workdir}' is not a directory", "workdir_missing")]
    if not readable(workdir):
        msg = f"workdir '{workdir}' cannot be entered by the user jobs run as"
        return [_error("workdir", msg, "workdir_unreadable")]
    return []


def _script_errors(
    script: str, workdir: str, readable: Readable, who: str | None
) -> list[FieldError]:
    path = os.path.normpath(os.path.join(workdir, script))
    if not os.path.isabs(script) and not _inside(path, workdir):
        msg = f"script '{script}' climbs out of its workdir '{workdir}'"
        return [_error("script", msg, "script_outside_workdir")]
    if not reachable(path, readable):
        return [_unreachable("script", path, who)]
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
