"""`argosy plan` and `argosy estimate`: the JSON contract, tables, emitters and bad input."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from argosy.cli.app import app

runner = CliRunner()
PREDICTED = {
    "step_time_s",
    "tokens_per_s",
    "tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "mfu",
    "memory_gib_per_device",
}
PARALLEL_KEYS = {"tp", "pp", "dp", "vpp", "mbs", "recompute", "zero", "cp", "ep", "sp"}


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_estimate_json_contract() -> None:
    result = invoke(
        "estimate", "--model", "gpt3-175b", "--cluster", "a100:3072",
        "--seq-len", "2048", "--global-batch", "1536", "--parallel",
        "tp=8,pp=16,dp=24,vpp=1,mbs=1,recompute=selective,zero=1", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["feasible"] is True and out["reasons"] == []
    assert set(out["predicted"]) >= PREDICTED
    pred = out["predicted"]
    assert pred["mfu"] == pytest.approx(pred["tflops_per_gpu"] / 312, rel=1e-6)
    assert pred["hardware_tflops_per_gpu"] >= pred["tflops_per_gpu"]
    assert pred["tokens_per_s"] == pytest.approx(1536 * 2048 / pred["step_time_s"])


def test_estimate_that_does_not_fit_names_the_overflowing_term() -> None:
    result = invoke(
        "estimate", "--model", "llama3-405b", "--cluster", "h100:64",
        "--seq-len", "8192", "--global-batch", "64", "--parallel",
        "tp=8,pp=1,dp=8,mbs=1,recompute=none,zero=0", "--json",
    )  # fmt: skip
    assert result.exit_code == 1  # a layout that does not fit is a failed estimate
    out = json.loads(result.stdout)
    assert out["feasible"] is False and out["fix"]
    assert (
        "exceeds" in out["reasons"][0]
        and "GiB" in out["reasons"][0]
        and "optimizer" in out["reasons"][0]
    )


def test_plan_json_contract_homogeneous() -> None:
    result = invoke(
        "plan",
        "--model",
        "llama3-70b",
        "--cluster",
        "h100:256",
        "--seq-len",
        "4096",
        "--global-batch",
        "512",
        "--top",
        "3",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["plans"]) == 3
    assert {"seconds", "candidates"} <= set(out["search"])
    for entry in out["plans"]:
        assert set(entry["parallel"]) >= PARALLEL_KEYS and set(entry["predicted"]) >= PREDICTED
    steps = [e["predicted"]["step_time_s"] for e in out["plans"]]
    assert steps == sorted(steps)


def test_plan_json_contract_mixed_has_groups() -> None:
    result = invoke(
        "plan",
        "--model",
        "llama3-8b",
        "--cluster",
        "a100:64+h100:64",
        "--seq-len",
        "4096",
        "--global-batch",
        "512",
        "--json",
    )
    assert result.exit_code == 0, result.output
    best = json.loads(result.stdout)["plans"][0]
    assert {g["chip"] for g in best["groups"]} == {"a100-80g", "h100-sxm"}
    assert sum(g["batch_share"] for g in best["groups"]) == 512
    for g in best["groups"]:
        assert {"devices", "parallel", "layers", "batch_share"} <= set(g)


def test_plan_that_cannot_fit_says_the_smallest_fix() -> None:
    result = invoke(
        "plan",
        "--model",
        "llama3-405b",
        "--cluster",
        "h100:8",
        "--seq-len",
        "8192",
        "--global-batch",
        "8",
        "--json",
    )
    assert result.exit_code == 1  # as in table mode
    out = json.loads(result.stdout)
    assert out["feasible"] is False and out["plans"] == []
    assert "fits on" in out["fix"] and "h100-sxm" in out["fix"]


@pytest.mark.parametrize(
    ("framework", "needle"),
    [
        ("megatron", "--tensor-model-parallel-size"),
        ("torchtitan", "--parallelism.tensor-parallel-degree"),
        ("deepspeed", '"zero_optimization"'),
    ],
    ids=["megatron", "torchtitan", "deepspeed"],
)
def test_emitters_print_pasteable_config(framework: str, needle: str) -> None:
    result = invoke(
        "plan",
        "--model",
        "llama3-70b",
        "--cluster",
        "h100:64",
        "--seq-len",
        "4096",
        "--global-batch",
        "64",
        "--emit",
        framework,
    )
    assert result.exit_code == 0, result.output
    assert needle in result.stdout
    if framework == "deepspeed":
        assert json.loads(result.stdout)["train_batch_size"] == 64


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "argosy", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", "--parallel", "tp=8,pp=2,dp=2"], "devices"),
        (
            [
                "estimate",
                "--model",
                "gpt-1.7b",
                "--cluster",
                "h100:16",
                "--parallel",
                "tp=16,pp=1,dp=1",
            ],
            "divide heads",
        ),
        (["estimate", "--parallel", "tp=8,pp=8,zero=5"], "zero"),
        (["plan", "--model", "llama3-9b"], "llama3-8b"),
        (["plan", "--cluster", "h1000:8"], "h100"),
        (["estimate", "--parallel", "tp=8,pp=8,tpp=2"], "tpp"),
    ],
    ids=[
        "degrees-do-not-multiply",
        "tp-not-dividing-heads",
        "bad-zero",
        "unknown-model",
        "unknown-chip",
        "unknown-key",
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    out = run_cli(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_default_plan_prints_a_table_without_importing_torch() -> None:
    code = (
        "import sys\n"
        "from argosy.cli.app import app\n"
        "try:\n    app(['plan'])\nexcept SystemExit:\n    pass\n"
        "print('HEAVY=' + ','.join(m for m in ('torch', 'ray', 'fastapi') if m in sys.modules))\n"
    )
    env = {**os.environ, "COLUMNS": "160"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert "HEAVY=\n" in out.stdout, out.stdout + out.stderr
    assert "llama3-8b" in out.stdout and "h100-sxm:64" in out.stdout and "MFU" in out.stdout


def test_estimate_that_does_not_fit_suggests_the_least_invasive_change() -> None:
    result = invoke(
        "estimate", "--model", "llama3-70b", "--cluster", "h100:64", "--seq-len", "8192",
        "--global-batch", "64", "--parallel", "tp=8,pp=1,dp=8,recompute=none,zero=0", "--json",
    )  # fmt: skip
    out = json.loads(result.stdout)
    assert out["feasible"] is False
    assert out["fix"].startswith("zero=") and "fits" in out["fix"]


def test_nic_override_slows_data_parallel_traffic() -> None:
    args = ["estimate", "--model", "llama3-8b", "--cluster", "h100:64", "--seq-len", "4096"]
    args += ["--global-batch", "64", "--parallel", "tp=1,pp=1,dp=64,zero=1", "--json"]
    fast = json.loads(invoke(*args).stdout)["predicted"]
    slow = json.loads(invoke(*args, "--nic-gbps", "10").stdout)["predicted"]
    assert slow["breakdown_s"]["dp"] > 10 * fast["breakdown_s"]["dp"]
    assert slow["step_time_s"] > fast["step_time_s"]


def test_mixed_plan_that_cannot_fit_names_each_short_group() -> None:
    result = invoke("plan", "--model", "llama3-405b", "--cluster", "a100:8+h100:8", "--json")
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert out["feasible"] is False and out["plans"] == []
    assert "a100-80g:" in out["fix"] and "h100-sxm:" in out["fix"] and "fits on" in out["fix"]


@pytest.mark.parametrize(
    ("zero", "needle"),
    [
        (1, "--use-distributed-optimizer"),
        (2, "--use-distributed-optimizer"),
        (3, "optim_grads_params"),
    ],
    ids=["zero1", "zero2", "zero3"],
)
def test_megatron_emitter_maps_zero_stages(zero: int, needle: str) -> None:
    from argosy.planner.emit import emitters
    from argosy.planner.models import load_model
    from argosy.planner.parallel import parse_parallel

    plan = parse_parallel(f"tp=8,pp=2,dp=4,vpp=2,mbs=1,recompute=full,zero={zero}")
    text = emitters.get("megatron")(plan, load_model("llama3-70b"), seq_len=8192, global_batch=64)
    assert needle in text and "--num-virtual-stages-per-pipeline-rank 2" in text
    assert "--recompute-granularity full" in text and "--num-query-groups 8" in text


SMALL = ("--model", "llama3-8b", "--cluster", "h100:8", "--seq-len", "4096")


def test_emit_prices_with_the_emitters_framework() -> None:
    from argosy.planner.emit import readers
    from argosy.planner.parallel import Parallel
    from argosy.planner.readback import expected, mismatches

    ranked = invoke("plan", *SMALL, "--global-batch", "32", "--json", "-f", "torchtitan")
    best = json.loads(ranked.stdout)["plans"][0]["parallel"]
    emitted = invoke("plan", *SMALL, "--global-batch", "32", "--emit", "torchtitan")
    assert emitted.exit_code == 0, emitted.output
    want = expected(Parallel(**best), 32, "torchtitan")
    assert mismatches(want, readers["torchtitan"](emitted.stdout, 8)) == []


def test_emit_auto_for_plain_pytorch_prints_an_argosy_launch_bundle() -> None:
    from argosy.runtime.mixed.plan import parse_plan

    result = invoke("plan", *SMALL, "--global-batch", "32", "-f", "pytorch", "--emit", "auto")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["framework"] == "pytorch" and doc["launch"].startswith("argosy launch --plan")
    assert parse_plan(doc).devices == 8


def test_emit_contradicting_the_framework_is_a_usage_error() -> None:
    result = invoke("plan", *SMALL, "-f", "torchtitan", "--emit", "megatron")
    assert result.exit_code == 2
    assert "megatron-core" in result.output and "torchtitan" in result.output


def test_mixed_plan_emits_a_launch_bundle_and_says_no_framework_runs_it() -> None:
    from argosy.runtime.mixed.plan import assign_ranks, parse_plan

    result = invoke(
        "plan", "-m", "layers=2,hidden=128,heads=4,vocab=512", "-c", "h100:1+a100-80g:2",
        "--seq-len", "128", "--global-batch", "12", "--emit", "auto",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert "no other framework" in doc["note"]
    assert len(assign_ranks(parse_plan(doc))) == 3


def test_mixed_batch_smaller_than_the_devices_gets_layer_splits_and_says_why() -> None:
    small = ["-c", "h100:1+a100-80g:2", "--seq-len", "128", "--global-batch", "2"]
    result = invoke("plan", "-m", "layers=8,hidden=128,heads=4,vocab=512", *small)
    assert result.exit_code == 0, result.output
    assert "no batch split" in result.output and "--global-batch 3 or more" in result.output
    doc = json.loads(
        invoke("plan", "-m", "layers=8,hidden=128,heads=4,vocab=512", *small, "--json").output
    )
    assert doc["plans"] and {p["split"] for p in doc["plans"]} == {"layers"}
    # too few layers for a layer split: no plan, and the fix names the batch
    none = invoke("plan", "-m", "layers=2,hidden=128,heads=4,vocab=512", *small)
    assert none.exit_code == 1 and "--global-batch 3 or more" in " ".join(none.output.split())
