"""`--config FILE` and `--set` are checked on every command, also on those that read no
setting: a missing file or an unknown key is a usage error (exit 2), never ignored."""

from __future__ import annotations

import pytest
from cli_helpers import run_main


@pytest.mark.parametrize("command", [["chips"], ["devices", "--cpu"]])
def test_a_missing_config_file_is_a_usage_error(monkeypatch, capsys, tmp_path, command) -> None:
    missing = tmp_path / "nonexist.yaml"
    assert run_main(monkeypatch, "--config", str(missing), *command) == 2
    assert f"{missing}: cannot read" in capsys.readouterr().err


def test_an_unknown_set_key_is_a_usage_error(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "--set", "nosection.x=1", "chips") == 2
    assert "field 'nosection': unknown key" in capsys.readouterr().err


def test_a_valid_setting_passes(monkeypatch, capsys) -> None:
    assert (
        run_main(monkeypatch, "--set", "hardware.default_cluster=a100:16", "chips", "--json") == 0
    )
