"""Emit a plan as what a user launches: Megatron-LM arguments (`emit_megatron.py`),
torchtitan 0.3 options (`emit_torchtitan.py`), a DeepSpeed JSON config with the
Megatron-DeepSpeed arguments (`emit_deepspeed.py`), or, for mixed-chip plans and the
plain PyTorch profile, an `argosy launch --plan` bundle (`bundle`).

Contract: `emitters.get(name)(plan, model, seq_len=, global_batch=) -> str` for a
homogeneous plan; a plan the framework cannot run raises `EmitRefusedError` with the reason.
`framework_of(emitter)` is the profile an emitter's plans are priced with (`--emit F`
implies it) and `emitter_of(framework)` the reverse (`--emit auto`). `readers` turn an
emitted text back into `Semantics` (argosy.planner.readback). Each emitter's output is
accepted by the real framework's own parser over the matrix of benchmarks/emit_check.py;
tests/planner/golden/ keeps what those parsers accepted.

    emitters.get("megatron")(parallel, model, seq_len=4096, global_batch=512)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from argosy.planner.emit_deepspeed import deepspeed, read_deepspeed
from argosy.planner.emit_megatron import megatron, read_megatron
from argosy.planner.emit_torchtitan import read_torchtitan, torchtitan
from argosy.plugins.registry import Registry

if TYPE_CHECKING:
    from argosy.hardware.cluster import Cluster

Emitter = Callable[..., str]
emitters: Registry[Emitter] = Registry("emitter")
emitters.register("megatron", megatron, aliases=("megatron-lm", "megatron-core", "nemo"))
emitters.register("torchtitan", torchtitan, aliases=("titan",))
emitters.register("deepspeed", deepspeed, aliases=("ds", "megatron-deepspeed"))

# the emitter's reader: text (and the launch's device count) -> Semantics
readers: dict[str, Callable] = {
    "megatron": read_megatron,
    "torchtitan": lambda text, devices: read_torchtitan(text),
    "deepspeed": read_deepspeed,
}
BUNDLE = "argosy"
_FRAMEWORK = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}
_EMITTER = {
    "megatron-core": "megatron",
    "megatron-lm": "megatron",
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
    "pytorch": BUNDLE,
}


def framework_of(emitter: str) -> str:
    """The framework profile an emitter's plans are priced with."""
    return _FRAMEWORK[emitters.canonical(emitter)]


def emitter_of(framework: str) -> str:
    """The emitter for a framework profile (`argosy` for plain PyTorch: argosy's runner)."""
    return _EMITTER[framework]


ONE_HOST = 8
"""Most devices a bundle's one-host command covers (the docs' CPU-emulated examples)."""


def bundle(result: dict, command: str = "train.py", cluster: Cluster | None = None) -> str:
    """An `argosy launch --plan` bundle: the plan document with only its best plan, the
    launch command (with the ranks the cluster needs), for a small cluster the same on one
    host with its chips emulated, and for mixed-chip plans the note that no other
    framework runs it."""
    best = result["plans"][0]
    doc = {k: v for k, v in result.items() if k not in ("plans", "alternatives")}
    doc["plans"] = [best]
    doc["launch"] = launch_command(cluster, command)
    if cluster is not None and cluster.num_devices <= ONE_HOST:
        chips = ",".join(f"{g.chip.id}:{g.num_devices}" for g in cluster.groups)
        doc["launch_emulated"] = (
            f"argosy launch --plan plan.json --nproc-per-node {cluster.num_devices} "
            f"--emulate-chips {chips} {command}"
        )
    if best.get("groups"):
        doc["note"] = (
            "a mixed-chip plan: each chip group has its own layout and batch share, joined by "
            "one gradient all-reduce; no other framework (Megatron-LM, torchtitan, DeepSpeed) "
            "runs it, so it is emitted for `argosy launch --plan` (docs/mixed.md)"
        )
    return json.dumps(doc, indent=2, default=str)


def launch_command(cluster: Cluster | None, command: str = "train.py") -> str:
    """The `argosy launch --plan` line for `cluster`: one host (`--nproc-per-node` all
    its devices) when it has one node or at most ONE_HOST devices, else the line each node
    runs, with its node rank and rank 0's host to fill in."""
    head = "argosy launch --plan plan.json"
    if cluster is None:
        return f"{head} {command}"
    if cluster.num_nodes == 1 or cluster.num_devices <= ONE_HOST:
        return f"{head} --nproc-per-node {cluster.num_devices} {command}"
    sizes = [g.devices_per_node for g in cluster.groups for _ in range(g.num_nodes)]
    nodes = f"--nnodes {len(sizes)} --node-rank <this node's index> --master-addr <node 0 host>"
    if len(set(sizes)) == 1:
        return f"{head} {nodes} --nproc-per-node {sizes[0]} {command}"
    layout = ",".join(str(n) for n in sizes)
    return f"{head} {nodes} --node-sizes {layout} --nproc-per-node <this node's size> {command}"
