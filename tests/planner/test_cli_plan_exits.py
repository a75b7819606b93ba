"""`argosy plan` exit codes and outputs agree with docs/planner.md: no plan is exit 1 in
table and JSON modes, a framework asked by name never gets a bundle it cannot run (exit
1), `--emit` with `--json` is a usage error, and a bundle's launch command runs as
written (the ranks it needs, and on a small cluster the chips to emulate)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from argosy.cli.app import app

MIXED = ("-m", "layers=2,hidden=128,heads=4,vocab=512", "-c", "h100:1+a100-80g:2",
         "--seq-len", "128", "--global-batch", "12")  # fmt: skip


def invoke(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


def test_no_plan_exits_1_with_and_without_json() -> None:
    table = invoke("-m", "llama3-405b", "-c", "h100:8")
    as_json = invoke("-m", "llama3-405b", "-c", "h100:8", "--json")
    assert table.exit_code == 1
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["feasible"] is False


def test_a_mixed_plan_asked_for_a_named_framework_exits_1_with_the_reason() -> None:
    result = invoke(*MIXED, "--emit", "megatron")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "megatron cannot run this plan" in result.stderr and "--emit argosy" in result.stderr


def test_emit_auto_and_argosy_print_the_bundle_of_a_mixed_plan() -> None:
    for emit in ("auto", "argosy"):
        result = invoke(*MIXED, "--emit", emit)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["launch"] == "argosy launch --plan plan.json --nproc-per-node 3 train.py"
        assert doc["launch_emulated"] == (
            "argosy launch --plan plan.json --nproc-per-node 3 "
            "--emulate-chips h100-sxm:1,a100-80g:2 train.py"
        )


def test_emit_with_json_is_a_usage_error() -> None:
    result = invoke("-m", "llama3-8b", "-c", "h100:64", "--emit", "megatron", "--json")
    assert result.exit_code == 2
    assert "leave out --json" in result.stderr


def test_a_multi_node_bundle_names_the_node_layout() -> None:
    from argosy.hardware.loader import load_cluster
    from argosy.planner.emit import launch_command

    even = launch_command(load_cluster("h100:64"))
    assert "--nnodes 8 " in even and "--nproc-per-node 8 " in even
    uneven = launch_command(load_cluster("h100:16+a100-80g:4"))
    assert "--node-sizes 8,8,4 " in uneven
