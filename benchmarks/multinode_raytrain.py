"""The Ray Train peer of benchmarks/multinode.py: examples/train_gpt.py's loop under
`TorchTrainer`, run as its own driver process against the benchmark's cluster.

    python benchmarks/multinode_raytrain.py --address 127.0.0.1:PORT --storage DIR \\
        --progress FILE --steps 400 --ckpt-every 5 --step-sleep 0.1

The same tiny GPT, data loader, optimizer and seeds as train_gpt.py (its defaults, built
from its own classes), DDP over gloo by `ray.train.torch.prepare_model`. Every
`--ckpt-every` steps rank 0 writes model, optimizer, loader and RNG state into a
directory and hands it to `ray.train.report(..., checkpoint=...)` (the other ranks report
the metrics alone); a restarted worker group resumes from `ray.train.get_checkpoint()`.
`FailureConfig(max_failures=3)`, two workers of `{"chip:cpu": 1}` each.

Each worker appends JSON lines to `--progress` (the benchmark reads them live): `start`
(rank, node id, pid, the step it resumed from), `step` (rank 0, each step) and `ckpt`
(rank 0, once `report` returned). The last line on stdout is the result as JSON.

benchmarks/multinode.py imports `run_raytrain`: it starts this script as a process,
watches the progress file through `RayTrainProbe`, and kills the node of rank 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")


def note(path: str, **fields: Any) -> None:
    """One progress line, appended whole (O_APPEND) with the wall-clock time."""
    line = json.dumps(fields | {"t": time.time()}) + "\n"
    with open(path, "a") as out:
        out.write(line)


def train_loop(config: dict[str, Any]) -> None:
    """train_gpt.py's loop on a Ray Train worker (see the module docstring)."""
    sys.path.insert(0, config["examples"])
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist
    import train_gpt as tg

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    args = tg.parse_args([])  # train_gpt.py's defaults: the same model and batch
    text = tg.make_corpus(args.seed)
    index = {c: i for i, c in enumerate(sorted(set(text)))}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    torch.manual_seed(args.seed)
    model = tg.GPT(len(index), args.block, args.dim, args.layers, args.heads, args.dropout)
    model = ray.train.torch.prepare_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = tg.Loader(data, args.block, args.batch, rank, world, args.seed)
    torch.manual_seed(args.seed + 1 + rank)
    start = restore(model, opt, loader)
    node = ray.get_runtime_context().get_node_id()
    note(config["progress"], ev="start", rank=rank, node=node, pid=_pid(), resumed=start)
    loss_sum = torch.zeros(1)
    for step in range(start + 1, config["steps"] + 1):
        x, y = loader.next()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum.copy_(loss.detach())
        dist.all_reduce(loss_sum)
        time.sleep(config["step_sleep"])
        if rank == 0:
            note(config["progress"], ev="step", step=step, loss=loss_sum.item() / world)
        if step % config["ckpt_every"] == 0 or step == config["steps"]:
            checkpoint(step, model, opt, loader, rank)
            if rank == 0:
                note(config["progress"], ev="ckpt", step=step)


def restore(model: Any, opt: Any, loader: Any) -> int:
    """Load the newest reported checkpoint, if any; returns its step (0 without one)."""
    import ray.train
    import torch

    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return 0
    with ckpt.as_directory() as d:
        state = torch.load(Path(d) / "state.pt", weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    loader.load_state_dict(state["loader"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def checkpoint(step: int, model: Any, opt: Any, loader: Any, rank: int) -> None:
    """Every rank reports; rank 0 with the checkpoint directory."""
    import tempfile

    import ray.train
    import torch

    metrics = {"step": step}
    if rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        state = {
            "model": model.state_dict(),
            "optim": opt.state_dict(),
            "loader": loader.state_dict(),
            "rng": torch.get_rng_state(),
            "step": step,
        }
        torch.save(state, Path(d) / "state.pt")
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


def _pid() -> int:
    return os.getpid()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True, help="the benchmark cluster's head")
    p.add_argument("--storage", required=True, help="RunConfig(storage_path=...)")
    p.add_argument("--progress", required=True, help="JSON lines the workers append")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--max-failures", type=int, default=3)
    args = p.parse_args(argv)

    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=args.address, logging_level="WARNING")
    config = {
        "examples": EXAMPLES,
        "progress": args.progress,
        "steps": args.steps,
        "ckpt_every": args.ckpt_every,
        "step_sleep": args.step_sleep,
    }
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"chip:cpu": 1}),
        run_config=RunConfig(
            name="multinode",
            storage_path=args.storage,
            failure_config=FailureConfig(max_failures=args.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=3),  # train_gpt.py keeps 3 too
        ),
    )
    t0 = time.time()
    try:
        result = trainer.fit()
        out = {"ok": result.error is None, "error": repr(result.error) if result.error else None}
        out["metrics"] = result.metrics
        out["checkpoint"] = result.checkpoint.path if result.checkpoint else None
    except Exception as err:  # a TrainingFailedError: report it, the benchmark decides
        out = {"ok": False, "error": repr(err)}
    out["fit_s"] = time.time() - t0
    print(json.dumps(out, default=str), flush=True)
    return 0 if out["ok"] else 1


class RayTrainProbe:
    """The workers' progress lines, as the benchmark reads them."""

    def __init__(self, path: Path, driver: subprocess.Popen) -> None:
        self.path, self.driver = path, driver

    def _lines(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text()
        except OSError:
            return []
        return [json.loads(x) for x in text.splitlines() if x.endswith("}")]

    def steps(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for e in self._lines():
            if e["ev"] == "step":
                out.setdefault(e["step"], e["t"])
        return out

    def after(self, t: float) -> list[tuple[int, float]]:
        return [(e["step"], e["t"]) for e in self._lines() if e["ev"] == "step" and e["t"] > t]

    def committed(self) -> int | None:
        return max((e["step"] for e in self._lines() if e["ev"] == "ckpt"), default=None)

    def rank1_node(self, cluster: Any) -> Any:
        starts = [e for e in self._lines() if e["ev"] == "start" and e["rank"] == 1]
        if not starts:
            return None
        node_id = starts[-1]["node"]
        return next((n for n in cluster.chip_workers() if n.node_id == node_id), None)

    def resumed_from(self, after_t: float) -> int | None:
        starts = [e for e in self._lines() if e["ev"] == "start" and e["t"] > after_t]
        return starts[0]["resumed"] if starts else None

    def failed(self) -> str | None:
        code = self.driver.poll()
        return None if code is None else f"the Ray Train driver exited with {code}"


def run_raytrain(cluster: Any, plan: dict[str, Any], work: Path, say: Any) -> dict[str, Any]:
    """The Ray Train scenario: this script as the driver, a node loss at the kill step;
    never raises for a failed scenario (the error and the driver's output are kept)."""
    from multinode_fault import node_loss

    work.mkdir(parents=True, exist_ok=True)
    progress, log = work / "progress.jsonl", work / "driver.log"
    command = [sys.executable, __file__, "--address", cluster.address]
    command += ["--storage", str(work / "storage"), "--progress", str(progress)]
    command += ["--steps", str(plan["steps"]), "--ckpt-every", str(plan["ckpt_every"])]
    command += ["--step-sleep", str(plan["step_sleep"])]
    env = dict(os.environ, RAY_ADDRESS=cluster.address)
    with log.open("ab") as out:
        driver = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    say(f"ray train: driver pid {driver.pid}, 2 workers, {plan['steps']} steps")
    result: dict[str, Any] = {"log_dir": str(work)}
    try:
        probe = RayTrainProbe(progress, driver)
        fault = node_loss(
            cluster, probe, plan["kill_step"], plan["rejoin_after_s"], plan["timeout_s"], say
        )
        result["fault"] = fault.as_dict()
        try:
            driver.wait(timeout=plan["timeout_s"])
        except subprocess.TimeoutExpired:
            result["error"] = f"the driver did not end within {plan['timeout_s']} s"
        result["final"] = _driver_result(log)
        result["committed_after"] = probe.committed()
        result["starts"] = [e for e in probe._lines() if e["ev"] == "start"]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    return result


def _driver_result(log: Path) -> dict[str, Any]:
    """The JSON line the driver printed last, or its output's tail."""
    lines = log.read_text(errors="replace").splitlines()
    for line in reversed(lines):
        if line.startswith("{") and '"ok"' in line:
            return json.loads(line)
    return {"ok": False, "error": "no result line", "tail": lines[-30:]}


if __name__ == "__main__":
    sys.exit(main())
