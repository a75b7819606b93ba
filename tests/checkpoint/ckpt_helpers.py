"""Helpers of the checkpoint tests (imported by conftest and by module fixtures)."""

from __future__ import annotations

import os

import torch


def small_state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {"epoch": 3, "rng": torch.get_rng_state(), "name": "run"},
    }


def assert_same(got: object, want: object) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (set(got), set(want))
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    else:
        assert got == want


def env_with_repo() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))


def meta_of(state: dict, step: int, rank: int = 0, world: int = 1) -> tuple:
    """(SnapshotMeta, the state's local tensors in entry order) of `state`, as a save
    would describe it."""
    from argosy.checkpoint.layout import (
        ObjectEntry,
        SnapshotMeta,
        data_len,
        encode_object,
        flatten,
        plan,
    )

    flat, mappings = flatten(state)
    entries, tensors, keys = plan(flat)
    objects = [ObjectEntry(k, encode_object(flat[k])) for k in keys]
    meta = SnapshotMeta(step, rank, world, mappings, entries, objects, data_len(entries))
    return meta, tensors
