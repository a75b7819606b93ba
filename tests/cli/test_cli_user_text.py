"""User text in errors and help is shown as typed, never read as Rich markup or emoji."""

from __future__ import annotations

import re

import typer
from cli_helpers import argosy, run_main
from typer.testing import CliRunner

from argosy.cli.app import app

TAG = re.compile(r"\\?\[[a-zA-Z/#@][^\[\]]*\]")


def test_a_closing_tag_in_input_is_a_usage_error(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "cluster", "[/]:8") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "'[/]'" in err


def test_an_emoji_code_in_input_is_printed_as_typed(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "cluster", "h100:abc") == 2
    assert "h100:abc:" in capsys.readouterr().err


def test_a_markup_tag_in_a_path_is_kept(monkeypatch, capsys, tmp_path) -> None:
    assert run_main(monkeypatch, "runs", "show", str(tmp_path / "[red]x")) == 2
    assert "[red]x" in capsys.readouterr().err


def test_usage_error_escapes_its_message(capsys) -> None:
    from argosy.cli.common import usage_error

    assert usage_error("pattern '^[a-z0-9_-]{1,32}$' [/]").exit_code == 2
    assert "'^[a-z0-9_-]{1,32}$' [/]" in capsys.readouterr().err


def _commands(group: object, prefix: tuple[str, ...] = ()):
    for name, command in getattr(group, "commands", {}).items():
        yield (*prefix, name), command
        yield from _commands(command, (*prefix, name))


def test_bracketed_words_in_help_are_shown() -> None:
    root = typer.main.get_command(app)
    runner = CliRunner()
    checked = 0
    for path, command in _commands(root):
        texts = [getattr(p, "help", None) or "" for p in command.params]
        tags = {t.lstrip("\\") for text in texts for t in TAG.findall(text)}
        if not tags:
            continue
        shown = runner.invoke(app, [*path, "--help"], terminal_width=400).stdout
        shown = " ".join(shown.split())
        for tag in tags:
            assert tag in shown, f"argosy {' '.join(path)} --help drops {tag}"
            checked += 1
    assert checked  # --tee's [rankN] at least


def test_launch_refuses_a_node_rank_past_a_single_node(tmp_path) -> None:
    run_dir = tmp_path / "run"
    done = argosy(
        "launch",
        "--nproc-per-node",
        "2",
        "--node-rank",
        "3",
        "--run-dir",
        str(run_dir),
        "examples/train_gpt.py",
        "--steps",
        "2",
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--node-rank 3 must be below --nnodes 1" in done.stderr
    assert "Traceback" not in done.stderr
    assert not run_dir.exists()  # refused before anything started
