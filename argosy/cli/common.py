"""What every command shares: consoles, the loaded config, JSON output, usage errors."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from argosy.config import PlatformConfig, load_config

console = Console()
err_console = Console(stderr=True)


class State:
    """Options of the root command, handed to subcommands through the typer context."""

    def __init__(self, config_path: str | None, overrides: list[str]) -> None:
        self.config_path = config_path
        self.overrides = overrides
        self._config: PlatformConfig | None = None

    def check(self) -> None:
        """Load the config now: a missing --config file or an unknown --set key is a usage
        error on every command, also on those that read no setting."""
        _ = self.config

    @property
    def config(self) -> PlatformConfig:
        if self._config is None:
            from pathlib import Path

            path = Path(self.config_path) if self.config_path else None
            self._config = load_config(path, overrides=self.overrides)
        return self._config


def config_of(ctx: typer.Context) -> PlatformConfig:
    """The config assembled from --config, the environment and --set."""
    state = ctx.find_root().obj
    if not isinstance(state, State):
        return load_config()
    return state.config


def print_json(data: Any) -> None:
    """Machine-readable output: one JSON document on stdout, nothing else."""
    typer.echo(json.dumps(data, indent=2, default=str))


def print_error(message: object) -> None:
    """Print `error: MESSAGE` on stderr, the message shown exactly as given.

    The message often quotes user input (paths, names, patterns): it is escaped, so a
    `[/]` or `[red]` in it is printed as typed instead of read as Rich markup or emoji.
    """
    err_console.print(
        f"[bold red]error:[/] {escape(str(message))}",
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )


def usage_error(message: str) -> typer.Exit:
    """Print `message` as a usage error and return the Exit(2) to raise."""
    print_error(message)
    return typer.Exit(code=2)
