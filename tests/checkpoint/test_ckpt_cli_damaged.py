"""`argosy ckpt ls|show|verify` on damaged directories: stray folders, torn manifests,
truncated files and corrupt rank indexes are reported, never a traceback."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from argosy.checkpoint import FlashCheckpointer
from argosy.checkpoint import disk as ckdisk
from argosy.cli.app import app


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("damaged") / "run"
    with FlashCheckpointer(directory, keep=5, job_id=f"test-{uuid.uuid4().hex[:10]}") as ckpt:
        for step in (10, 20, 30):
            ckpt.save(step, {"model": {"w": torch.ones(64, 64) * step}, "pos": step})
            ckpt.wait()
    return directory


@pytest.fixture
def ckpt_dir(saved: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "run"
    shutil.copytree(saved, directory)
    return directory


def run(*args: str):
    return CliRunner().invoke(app, ["ckpt", *args])


def step_dir(directory: Path, step: int) -> Path:
    return directory / ckdisk.step_dir_name(step)


def statuses(directory: Path) -> dict[int, str]:
    result = run("ls", str(directory), "--json")
    assert result.exit_code == 0, result.output
    return {r["step"]: r["status"] for r in json.loads(result.stdout)}


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_a_stray_step_folder_is_left_out(ckpt_dir: Path, command: str) -> None:
    (ckpt_dir / "step_abc").mkdir()
    (ckpt_dir / "step_").mkdir()
    result = run(command, str(ckpt_dir))
    assert result.exit_code == 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "step_abc" not in result.output


def test_ls_calls_truncated_and_missing_files_torn(ckpt_dir: Path) -> None:
    data = step_dir(ckpt_dir, 30) / ckdisk.data_file(0)
    data.write_bytes(data.read_bytes()[:1000])
    (step_dir(ckpt_dir, 20) / "rank0.meta").unlink()
    assert statuses(ckpt_dir) == {
        10: "complete",
        20: "torn (missing file)",
        30: "torn (truncated file)",
    }


def test_ls_tells_an_unreadable_manifest_from_a_missing_one(ckpt_dir: Path) -> None:
    (step_dir(ckpt_dir, 20) / ckdisk.MANIFEST).write_text('{"files": ')
    (step_dir(ckpt_dir, 30) / ckdisk.MANIFEST).unlink()
    assert statuses(ckpt_dir) == {
        10: "complete",
        20: "torn (unreadable manifest)",
        30: "torn (no manifest)",
    }


def test_show_skips_torn_newer_steps(ckpt_dir: Path) -> None:
    (step_dir(ckpt_dir, 20) / ckdisk.MANIFEST).write_text('{"files": ')
    (step_dir(ckpt_dir, 30) / ckdisk.MANIFEST).unlink()
    result = run("show", str(ckpt_dir), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["manifest"]["step"] == 10
    assert "note: skipped step_000000000030" in result.stderr


def test_show_of_a_torn_step_is_one_line_and_exit_1(ckpt_dir: Path) -> None:
    (step_dir(ckpt_dir, 20) / ckdisk.MANIFEST).write_text('{"files": ')
    result = run("show", str(ckpt_dir), "--step", "20")
    assert result.exit_code == 1
    assert "step 20 is torn (unreadable manifest)" in result.stderr
    assert not isinstance(result.exception, ckdisk.TornCheckpointError)


def test_unknown_step_lists_only_complete_steps(ckpt_dir: Path) -> None:
    (step_dir(ckpt_dir, 20) / ckdisk.MANIFEST).write_text('{"files": ')
    result = run("show", str(ckpt_dir), "--step", "99")
    assert result.exit_code != 0
    assert "complete steps: 10, 30" in " ".join(str(result.exception).split())


def test_show_of_a_corrupt_rank_index_is_one_line_and_exit_1(ckpt_dir: Path) -> None:
    index = step_dir(ckpt_dir, 30) / "rank0.meta"
    index.write_bytes(b"g" * index.stat().st_size)  # same size: only the checksum tells
    result = run("show", str(ckpt_dir))
    assert result.exit_code == 1, result.output
    assert "rank 0 of step_000000000030 is unreadable" in result.stderr
    assert "checksum mismatch" in result.stderr


def test_verify_reports_torn_manifests_and_exits_1(ckpt_dir: Path) -> None:
    (step_dir(ckpt_dir, 20) / ckdisk.MANIFEST).write_text('{"files": ')
    (ckpt_dir / "step_abc").mkdir()
    result = run("verify", str(ckpt_dir))
    assert result.exit_code == 1
    assert "unreadable manifest" in result.output
    one = run("verify", str(ckpt_dir), "--step", "20")
    assert one.exit_code == 1 and "unreadable manifest" in one.output


def test_verify_prints_file_names_as_they_are(ckpt_dir: Path) -> None:
    manifest_path = step_dir(ckpt_dir, 30) / ckdisk.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["[/]x"] = {"bytes": 1, "crc32": 0}
    manifest_path.write_text(json.dumps(manifest))
    result = run("verify", str(ckpt_dir), "--step", "30")
    assert result.exit_code == 1, result.output
    assert "[/]x: missing" in result.output
