"""benchmarks/train_gpu.py end to end: one rank of train_gpt SIGKILLed, resumed bit-exact.

The CPU case (a tiny model) runs everywhere; the GPU case needs a CUDA device and is
skipped without one. Both run the benchmark as a user would, `python benchmarks/...`.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runtime_helpers import REPO

BENCH = REPO / "benchmarks" / "train_gpu.py"


def run_bench(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(BENCH), "--run-root", str(tmp_path / "runs"), "--json", str(out)]
    done = subprocess.run([*cmd, *flags], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def check(result: dict, steps: int) -> None:
    assert result["bit_exact"] and result["losses_equal"]
    assert result["params_sha256"]["clean"] == result["params_sha256"]["faulty"]
    assert result["faults"] == 1 and result["steps"] == steps
    assert 0 < result["resumed_from_step"] < result["killed_at_step"]
    assert result["redone_steps"] == result["killed_at_step"] - 1 - result["resumed_from_step"]
    assert result["clean_s"] > 0 and result["faulty_s"] > 0
    assert result["lost_s_per_fault"] == pytest.approx(result["faulty_s"] - result["clean_s"])
    assert result["target_lost_s"] == 10.0


@pytest.mark.slow
@pytest.mark.integration
def test_cpu_rank_killed_mid_run_resumes_bit_exact(tmp_path: Path) -> None:
    result = run_bench(tmp_path, "--device", "cpu", "--steps", "16", "--model-size", "tiny")
    check(result, 16)
    assert result["device"] == "cpu" and result["backend"] == "gloo"
    assert result["killed_at_step"] == 10 and result["resumed_from_step"] == 8


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.integration
def test_gpu_rank_killed_mid_run_resumes_bit_exact(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    result = run_bench(tmp_path, "--device", "cuda", "--steps", "40", "--model-size", "small")
    check(result, 40)
    assert result["device"].startswith("cuda:") and result["backend"] == "nccl"
    print(f"lost per fault on {result['device']}: {result['lost_s_per_fault']:.2f} s")
    assert result["lost_s_per_fault"] < 3 * result["target_lost_s"]
