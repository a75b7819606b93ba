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

A line under "rank N, last lines:" quotes the job's own output, which is its queue's and
the admins' only: the reason every token reads keeps of it an exception's class alone
(`public_line`); the whole line is the job's `error`, shown to its queue and the admins.

    telling_line("...\\n  ValueError: boom\\n")   # -> "ValueError: boom"
    public_line(*telling(text))                      # what every token may read of it
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
    return telling(text)[0]


def telling(text: str) -> tuple[str, bool]:
    """`telling_line`, and whether that line quotes a rank's output (an indented line
    under a "rank N, last lines:" header): the job's own words, not the launcher's."""
    pairs = quoted_lines(text)
    lines = [clean for clean, _ in pairs]
    for pick in (_exception, _error_word, _boxed_error, _os_complaint, _last_rank_line):
        index = pick(lines)
        if index >= 0:
            return lines[index], pairs[index][1]
    return "", False


def quoted_lines(text: str) -> list[tuple[str, bool]]:
    """Each non-blank line of `text`, stripped, and whether it quotes a rank's output."""
    out, quoting = [], False
    for raw in text.splitlines():
        clean = raw.strip(BOX)
        if not clean:
            continue
        if clean.endswith("last lines:"):
            out.append((clean, False))
            quoting = True
            continue
        quoting = quoting and raw[:1].isspace()
        out.append((clean, quoting))
    return out


def public_line(line: str, quoted: bool) -> str:
    """What every token may read of a telling line: the launcher's and the shell's own
    words whole; of a rank's output (its queue's and the admins' only), an exception's
    class alone, else nothing of it."""
    if not quoted or not line:
        return line
    if EXCEPTION.match(line):
        return f"{line.split(':', 1)[0]} (its message is in the job's output)"
    return "see the job's output (a rank's last lines)"


def error_clause(line: str, said: str = "") -> str:
    """`line` as a clause to append to a reason: "; error: <line>" ("" when there is no
    line or `said` already holds it; no second "error:" when the line starts with one)."""
    if not line or line in said:
        return ""
    return f"; {line}" if line.lower().startswith("error:") else f"; error: {line}"


def _last_match(lines: list[str], pattern: re.Pattern[str]) -> int:
    return next((i for i in range(len(lines) - 1, -1, -1) if pattern.search(lines[i])), -1)


def _exception(lines: list[str]) -> int:
    return _last_match(lines, EXCEPTION)


def _error_word(lines: list[str]) -> int:
    return _last_match(lines, ERROR_WORD)


def _os_complaint(lines: list[str]) -> int:
    return _last_match(lines, OS_COMPLAINT)


def _boxed_error(lines: list[str]) -> int:
    """The first line inside the last box titled "Error" (click's and typer's usage
    errors)."""
    for i in range(len(lines) - 2, -1, -1):
        if lines[i] == "Error":
            return i + 1
    return -1


def _last_rank_line(lines: list[str]) -> int:
    """The last line after the launcher's last "rank N, last lines:" header."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].endswith("last lines:"):
            return len(lines) - 1 if i < len(lines) - 1 else -1
    return -1
