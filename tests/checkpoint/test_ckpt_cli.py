"""`argosy ckpt ls|show|verify` on a real checkpoint directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid

import pytest
import torch
from typer.testing import CliRunner

from argosy.checkpoint import FlashCheckpointer
from argosy.checkpoint import commit as ckcommit
from argosy.checkpoint import disk as ckdisk
from argosy.cli.app import app


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli") / "run"
    with FlashCheckpointer(directory, keep=5, job_id=f"test-{uuid.uuid4().hex[:10]}") as ckpt:
        for step in (10, 20):
            ckpt.save(step, {"model": {"w": torch.ones(64, 64) * step}, "pos": step})
            ckpt.wait()
    return directory


def run(*args: str):
    return CliRunner().invoke(app, ["ckpt", *args])


def test_ls_lists_complete_and_unfinished_steps(ckpt_dir, tmp_path):
    directory = tmp_path / "run"
    shutil.copytree(ckpt_dir, directory)
    (directory / ckcommit.tmp_dir_name(30, epoch=7)).mkdir()
    result = run("ls", str(directory), "--json")
    assert result.exit_code == 0, result.output
    rows = {r["step"]: r for r in json.loads(result.output)}
    assert {s: r["status"] for s, r in rows.items()} == {
        10: "complete",
        20: "complete",
        30: "unfinished",
    }
    assert rows[20]["bytes"] > 64 * 64 * 4 and rows[20]["world_size"] == 1


def test_show_lists_tensors_and_objects_of_the_newest_step(ckpt_dir):
    result = run("show", str(ckpt_dir), "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["manifest"]["step"] == 20
    assert shown["tensors"] == [
        {
            "name": "model.w",
            "dtype": "float32",
            "shape": [64, 64],
            "global_shape": [64, 64],
            "bytes": 64 * 64 * 4,
        }
    ]
    assert [o["name"] for o in shown["objects"]] == ["pos"]


def test_verify_passes_then_names_the_corrupt_file(ckpt_dir, tmp_path):
    directory = tmp_path / "run"
    shutil.copytree(ckpt_dir, directory)
    assert run("verify", str(directory)).exit_code == 0
    data = directory / ckdisk.step_dir_name(10) / ckdisk.data_file(0)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    result = run("verify", str(directory))
    assert result.exit_code == 1
    assert "step_000000000010/__0_0.distcp: checksum mismatch" in result.output.replace("\n", "")


@pytest.mark.parametrize(
    "args, want",
    [
        (["ls", "/no/such/dir"], "is not a checkpoint directory"),
        (["show", "{dir}", "--step", "99"], "no complete step 99 in"),
        (["show", "{dir}", "--rank", "3"], "has no rank 3"),
    ],
    ids=["missing-dir", "unknown-step", "unknown-rank"],
)
def test_bad_input_is_one_line_and_exit_2(ckpt_dir, args, want):
    args = [a.format(dir=ckpt_dir) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "argosy", "ckpt", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert want in proc.stderr and "Traceback" not in proc.stderr
