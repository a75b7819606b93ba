"""Layer-split plans: pipeline stages take the plan's layer counts (GPipe over gloo)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import REPO, argosy, losses
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from argosy.runtime.mixed.pipeline import split_layers

SCRIPT = str(REPO / "examples" / "train_mixed.py")
MODEL = ["--hidden", "32", "--dim", "8", "--block", "16", "--steps", "4"]
MODEL += ["--checkpointer", "disk"]  # not under test here: no persister process per rank
GLOBAL_BATCH = 6


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=5), st.integers(-2, 2))
def test_split_layers_follows_the_counts_or_names_them(counts: list[int], off: int) -> None:
    layers = [nn.Identity() for _ in range(max(0, sum(counts) + off))]
    if len(layers) != sum(counts):
        with pytest.raises(ValueError, match=r"do not cover the model's"):
            split_layers(layers, counts)
        return
    parts = split_layers(layers, counts)
    assert [len(p) for p in parts] == counts
    assert [m for p in parts for m in p] == layers  # consecutive, in order, each once


@pytest.fixture(scope="module")
def layer_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """The planner's layer-split plan for H100 x1 + A100 x2 (its best such plan)."""
    args = ["plan", "-m", "gpt-1.7b", "-c", "h100:1+a100-80g:2", "--global-batch"]
    done = argosy(*args, str(GLOBAL_BATCH), "--seq-len", "2048", "--json", "--top", "20")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    entry = next(p for p in data["plans"] if p.get("split") == "layers")
    path = tmp_path_factory.mktemp("plan") / "layers.json"
    path.write_text(json.dumps({**data, "plans": [entry]}))
    counts = []
    for g in entry["groups"]:  # a group's layers are spread evenly over its stages
        base, extra = divmod(g["layers"], g["devices"])
        counts += [base + (1 if i < extra else 0) for i in range(g["devices"])]
    return path, counts


@pytest.mark.integration
def test_pipeline_stages_train_like_one_process(
    layer_plan: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """3 stages holding the plan's layer counts (GPipe, gloo, emulated chips) give the
    losses of the same model trained in one process, to 1e-5, step by step."""
    path, counts = layer_plan
    assert len(set(counts)) > 1 and len(counts) == 3, counts  # uneven stages to test
    single = [sys.executable, SCRIPT, *MODEL, "--global-batch", str(GLOBAL_BATCH)]
    single += ["--layers", str(sum(counts)), "--micro-batch", "2"]
    run_env = {**os.environ, "ARGOSY_RUN_DIR": str(tmp_path / "single")}
    run_env.pop("ARGOSY_MIXED", None)
    reference = subprocess.Popen(  # the one-process run, alongside the launch
        single, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env
    )
    try:
        head = ["launch", "--quiet", "--run-dir", str(tmp_path / "pipe"), "--nproc-per-node", "3"]
        emulate = ["--plan", str(path), "--emulate-chips", "h100:1,a100-80g:2"]
        env = {"ARGOSY_EMULATE_SAMPLE_S": "h100-sxm=0.0005,a100-80g=0.0015"}
        done = argosy(*head, *emulate, SCRIPT, *MODEL, "--warmup", "1", timeout=300, env=env)
        out, err = reference.communicate(timeout=300)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "pipe" / "logs" / "attempt0" / "rank1.log").read_text()
    assert f"stage 1/3 layers {counts[1]}" in log
    got = losses(tmp_path / "pipe")

    assert reference.returncode == 0, err
    want = {int(s): float(v) for s, v in re.findall(r"step (\d+) loss (\S+)", out)}
    assert sorted(want) == [1, 2, 3, 4] and want[4] < want[1]
    assert sorted(got) == sorted(want)
    for step, loss in want.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), f"step {step}"
