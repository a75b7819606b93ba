"""The CLI surface of the foundation: help stays light, tables and JSON, exit code 2."""

import json
import subprocess
import sys

import pytest
from cli_helpers import argosy
from typer.testing import CliRunner

from argosy.cli.app import app

runner = CliRunner()


def test_help_imports_no_heavy_dependency() -> None:
    code = (
        "import sys\n"
        "from argosy.cli.app import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'fastapi') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY=\n" in out.stdout, out.stdout + out.stderr


def test_chips_json_lists_the_catalog_with_sources() -> None:
    result = runner.invoke(app, ["chips", "--json"])
    assert result.exit_code == 0
    chips = json.loads(result.stdout)
    by_id = {c["id"]: c for c in chips}
    assert {"h100-sxm", "910b", "mi300x", "gaudi3", "cpu"} <= set(by_id)
    assert all(c["source"] for c in chips)
    assert by_id["h100-sxm"]["link"]["domain_size"] == 8


def test_chips_table_shows_every_chip() -> None:
    result = argosy("chips", columns=160, timeout=60)
    assert result.returncode == 0
    for chip_id in ("a100-40g", "mi250x", "k100-ai", "gaudi2"):
        assert chip_id in result.stdout


def test_cluster_json_describes_groups_and_levels() -> None:
    result = runner.invoke(app, ["cluster", "a100-80g:512+910b:512", "--json"])
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert summary["devices"] == 1024 and summary["nodes"] == 128
    assert [g["chip"] for g in summary["groups"]] == ["a100-80g", "910b"]
    assert [lv["name"] for lv in summary["levels"]] == ["leaf", "spine"]


def test_devices_reports_this_host() -> None:
    result = runner.invoke(app, ["devices", "--json", "--cpu"])
    assert result.exit_code == 0
    devices = json.loads(result.stdout)
    assert any(d["backend"] == "cpu" and d["catalog_id"] == "cpu" for d in devices)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["cluster", "h1000:8"], "unknown chip 'h1000'; known: h100"),
        (["cluster", "h100"], "is not CHIP:COUNT"),
        (["--set", "hardware.nope=1", "cluster"], "unknown key"),
        (["chips", "--no-such-flag"], "No such option"),
    ],
    ids=["unknown-chip", "malformed-shorthand", "unknown-config-key", "unknown-flag"],
)
def test_usage_errors_exit_2_without_traceback(args: list[str], want: str) -> None:
    result = argosy(*args, columns=80, timeout=60)
    assert result.returncode == 2
    assert want in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
