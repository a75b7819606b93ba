"""Why an attempt failed, in one line: picked from the tail of the launcher's output.

Pure text in, one line out; reading the file is `argosy.server.views.launcher_error`.
The launcher (`argosy launch`, `argosy serve`) ends a failure with what it knows: a
rank's traceback among "rank N, last lines:", its own `error: ...` line, a usage box
from the CLI parser, or the shell's `Argument list too long`. The first kind found,
searching from the end of the text, wins:

 1. the exception line of a Python traceback (`FileNotFoundError: [Errno 2] ...`);
 2. an `error:` line (`error: script 'x.py' not found`, `argosy serve: error: ...`);
 3. the message inside the CLI's "Error" box (`No such option: --bogus`);
 4. an operating-system complaint (`Argument list too long`, `Permission denied`, ...);
 5. the last line a rank wrote (under the launcher's "last lines:").

    telling_line("...\\n  ValueError: boom\\n")   # -> "ValueError: boom"
    reason += error_clause(line, reason)             # "; error: ValueError: boom"
"""

from __future__ import annotations

import re

ERROR_TAIL_BYTES = 16 << 10
"""How much of the end of the launcher's output is searched."""
ERROR_LINE_CHARS = 300
"""Longest error line put into a job's reason."""

EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)(: .*)?$")
ERROR_WORD = re.compile(r"(^|\s|:)error:\s*\S", re.IGNORECASE)
OS_COMPLAINT = re.compile(
    r"argument list too long|permission denied|no such file or directory|command not found"
    r"|exec format error|cannot allocate memory|out of memory",
    re.IGNORECASE,
)
BOX = "│╭╮╰╯─┃━┏┓┗┛ \t"


def telling_line(text: str) -> str:
    """The line of `text` that says why it failed ("" when none does)."""
    lines = [clean for raw in text.splitlines() if (clean := raw.strip(BOX))]
    for pick in (_exception, _error_word, _boxed_error, _os_complaint, _last_rank_line):
        found = pick(lines)
        if found:
            return found
    return ""


def error_clause(line: str, said: str = "") -> str:
    """`line` as a clause to append to a reason: "; error: <line>" ("" when there is no
    line or `said` already holds it; no second "error:" when the line starts with one)."""
    if not line or line in said:
        return ""
    return f"; {line}" if line.lower().startswith("error:") else f"; error: {line}"


def _last_match(lines: list[str], pattern: re.Pattern[str]) -> str:
    return next((line for line in reversed(lines) if pattern.search(line)), "")


def _exception(lines: list[str]) -> str:
    return _last_match(lines, EXCEPTION)


def _error_word(lines: list[str]) -> str:
    return _last_match(lines, ERROR_WORD)


def _os_complaint(lines: list[str]) -> str:
    return _last_match(lines, OS_COMPLAINT)


def _boxed_error(lines: list[str]) -> str:
    """The first line inside the last box titled "Error" (click's and typer's usage
    errors)."""
    for i in range(len(lines) - 2, -1, -1):
        if lines[i] == "Error":
            return lines[i + 1]
    return ""


def _last_rank_line(lines: list[str]) -> str:
    """The last line after the launcher's last "rank N, last lines:" header."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].endswith("last lines:"):
            rest = lines[i + 1 :]
            return rest[-1] if rest else ""
    return ""
