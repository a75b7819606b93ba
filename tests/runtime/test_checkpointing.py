"""Restore falls back past unreadable checkpoints and says so; nothing usable means step 0."""

from pathlib import Path

import pytest
import torch

from argosy.runtime.checkpointing import DiskCheckpointer, open_checkpointer, restore


def saved(tmp_path: Path, steps: list[int]) -> DiskCheckpointer:
    ckpt = DiskCheckpointer(tmp_path, keep=5)
    for step in steps:
        ckpt.save(step, {"w": torch.full((3,), float(step)), "step": step})
    return ckpt


def test_restore_returns_the_newest(tmp_path: Path) -> None:
    step, state = restore(saved(tmp_path, [5, 10, 15]), say=lambda m: None)
    assert step == 15 and torch.equal(state["w"], torch.full((3,), 15.0))


def test_corrupt_newest_falls_back_to_the_previous_and_says_so(tmp_path: Path) -> None:
    ckpt = saved(tmp_path, [5, 10, 15])
    (tmp_path / "step-15" / "rank-0.pt").write_bytes(b"not a checkpoint")
    said: list[str] = []
    step, state = restore(ckpt, say=said.append)
    assert step == 10 and state["step"] == 10
    assert any("step 15 is unreadable" in m for m in said)


def test_all_corrupt_starts_from_zero_and_says_so(tmp_path: Path) -> None:
    ckpt = saved(tmp_path, [5, 10])
    for step in (5, 10):
        (tmp_path / f"step-{step}" / "rank-0.pt").write_bytes(b"")
    said: list[str] = []
    assert restore(ckpt, say=said.append) == (0, None)
    assert said[-1] == "no usable checkpoint; starting from step 0"


def test_missing_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    said: list[str] = []
    assert restore(DiskCheckpointer(tmp_path / "none"), say=said.append) == (0, None)
    assert said == []


def test_keep_prunes_old_steps(tmp_path: Path) -> None:
    ckpt = DiskCheckpointer(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        ckpt.save(step, {"step": step})
    assert ckpt.steps() == [3, 4]


def test_unknown_checkpointer_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected auto, flash or disk"):
        open_checkpointer(tmp_path, kind="tape")
