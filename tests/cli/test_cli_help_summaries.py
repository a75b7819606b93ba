"""Each command's summary in `argosy --help` (its docstring's first paragraph) is one
line, so the command list never wraps mid-sentence."""

from __future__ import annotations

import inspect

import typer

from argosy.cli.app import app


def _commands(group: object, prefix: tuple[str, ...] = ()):
    for name, command in getattr(group, "commands", {}).items():
        yield (*prefix, name), command
        yield from _commands(command, (*prefix, name))


def test_every_command_summary_is_one_line() -> None:
    long = []
    for path, command in _commands(typer.main.get_command(app)):
        summary = inspect.cleandoc(command.help or "").split("\n\n")[0]
        if "\n" in summary:
            long.append(" ".join(path))
    assert long == []
