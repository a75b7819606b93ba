"""Single-device peak memory of an eager Hugging Face Llama training step, tracked at the
dispatcher, against argosy's `pytorch` profile (issue 33).

    python benchmarks/planner_memory_single.py                # tracked (CPU, fake tensors)
    python benchmarks/planner_memory_single.py --before       # the profile before issue 33
    python benchmarks/planner_memory_single.py --explain m1   # what is live at one peak
    python benchmarks/planner_memory_single.py --device cuda  # the real step on a GPU

The program is the one `reference/measured_h100.md` measured: `LlamaForCausalLM` with
random init, `attn_implementation="sdpa"`, bf16 weights and gradients (no fp32 master
copy), `torch.optim.AdamW(fused=True)` (bf16 moments), untied embeddings, loss over all
positions (`labels=input_ids`), no recompute unless the point says `ckpt` (then
`activation_checkpointing_enable(use_reentrant=False)`, or `gradient_checkpointing_enable`
in a transformers without it: every decoder layer recomputed).
One step is `ga` micro-batches of `mbs` sequences, `(model(...).loss / ga).backward()`
each, then `opt.step(); opt.zero_grad(set_to_none=True)`; two steps are run, so the
second starts with the Adam moments allocated.

Contract of the tracker (`LiveBytes`): a `TorchDispatchMode` that counts the bytes of
every tensor storage an op returns (and of storages registered with `track`) from the op
until the storage is freed, rounding each storage up to CUDA's 512-byte block; its
`peak` is what `torch.cuda.max_memory_allocated` counts for the same program, less what
ops allocate inside themselves (see below). Under `FakeTensorMode` on the CPU no data is
allocated, so an 8B-parameter step is tracked in seconds; the process holds about 400 MiB,
the libraries. `torch.optim.AdamW(fused=True)` runs fused on the CPU too.

Where fake CPU tensors do not stand for the CUDA program, and what neither counts:
- transformers cannot read fake position ids when it looks for packed sequences, and
  would then build a [mbs, 1, seq, seq] mask and repeat K and V per query head; the
  tracker gives it the real tensors' answer (no packing: no mask, `is_causal=True`,
  `enable_gqa`), see `real_mask_decision`;
- SDPA: on the CPU the dispatcher hits `_scaled_dot_product_flash_attention_for_cpu`
  (and its backward), on CUDA `_scaled_dot_product_flash_attention`; both keep the
  output and an fp32 log-sum-exp, never a seq x seq score matrix. CUDA's flash backward
  allocates inside the op (fp32 dq accumulator, GQA's expanded dk/dv): tens of MiB per
  layer at these shapes, not seen here;
- embedding backward on CUDA sorts indices and sums fp32 partial segments inside the
  op (up to tokens x hidden x 4 bytes), not seen here;
- the cuBLAS workspace (32 MiB on Hopper) comes from the caching allocator and is
  counted by `max_memory_allocated`, not here;
- neither counts the CUDA context (about 0.5 GiB) or the allocator's cached,
  fragmented blocks (`memory_reserved` minus `memory_allocated`).
With more micro-batches than two, the tracked run stops at two per step: micro-batches
2..ga see the same live set (gradients allocated, accumulation temporaries); the CUDA run
does all of them.

The comparison is with argosy's allocated estimate (`Memory.allocated`, no allocator
reserve): the tracked peak is `max_memory_allocated`'s counterpart, while the reserve
(5% + 0.5 GiB) stands for the caching allocator's spare blocks and the CUDA context,
which only a GPU run can show. The OOM verdict is argosy's total (with the reserve)
against the catalog's 80 GiB, and, for the tracked step, its peak + `CONTEXT_GIB` against
an H100's 81,559 MiB.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from argosy.hardware.loader import load_cluster  # noqa: E402
from argosy.planner.frameworks import Profile, load_framework  # noqa: E402
from argosy.planner.memory import GIB  # noqa: E402
from argosy.planner.models import ModelSpec  # noqa: E402
from argosy.planner.parallel import Parallel  # noqa: E402
from argosy.planner.search import estimate_one  # noqa: E402

BLOCK_BYTES = 512  # CUDACachingAllocator's kMinBlockSize: every block is a multiple
H100_USABLE_GIB = 81559 / 1024  # nvidia-smi total of an H100 80GB HBM3 (MiB)
CONTEXT_GIB = 0.5  # CUDA context and cuBLAS workspace, outside the tracked peak
LOGITS_GRID = np.arange(8.0, 16.01, 0.5)


class LiveBytes(TorchDispatchMode):
    """Live storage bytes seen at the dispatcher, each rounded up to `block` bytes."""

    def __init__(self, block: int = BLOCK_BYTES, record: bool = False) -> None:
        super().__init__()
        self.block = block
        self.record = record
        self.current = 0
        self.peak = 0
        self.peak_op = ""
        self.peak_by_op: dict[str, int] = {}
        self._live: dict[int, tuple[int, str]] = {}

    def rounded(self, nbytes: int) -> int:
        return math.ceil(nbytes / self.block) * self.block if nbytes else 0

    def _add(self, storage: torch.UntypedStorage, op: str) -> None:
        key = storage._cdata
        if key in self._live:
            return
        nbytes = self.rounded(storage.nbytes())
        self._live[key] = (nbytes, op)
        self.current += nbytes
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        nbytes, _ = self._live.pop(key)
        self.current -= nbytes

    def _note_peak(self, op: str) -> None:
        if self.current > self.peak:
            self.peak, self.peak_op = self.current, op
            if self.record:
                by_op: dict[str, int] = {}
                for nbytes, source in self._live.values():
                    by_op[source] = by_op.get(source, 0) + nbytes
                self.peak_by_op = by_op

    def track(self, *objs: Any) -> None:
        """Count tensors made before the mode: tensors, modules (parameters, buffers,
        gradients) and optimizers (their state tensors)."""
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                tensors = [*obj.parameters(), *obj.buffers()]
                tensors += [p.grad for p in obj.parameters() if p.grad is not None]
                self.track(*tensors)
            elif isinstance(obj, torch.optim.Optimizer):
                self.track(*(t for s in obj.state.values() for t in s.values()))
            elif isinstance(obj, torch.Tensor):
                self._add(obj.untyped_storage(), "external")
        self._note_peak("external")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t.untyped_storage(), name)
        self._note_peak(name)
        return out


@dataclass(frozen=True)
class Point:
    """One single-device training step."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    mbs: int
    ga: int
    ckpt: bool = False

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name, layers=self.layers, hidden=self.hidden, heads=self.heads,
            kv_heads=self.kv_heads, ffn=self.ffn, vocab=self.vocab, gated=True,
        )  # fmt: skip

    def label(self) -> str:
        ac = ", full AC" if self.ckpt else ""
        return (f"L{self.layers} h{self.hidden} f{self.ffn} V{self.vocab // 1000}k "
                f"s{self.seq} mbs{self.mbs} ga{self.ga}{ac}")  # fmt: skip


V128, V32 = 128256, 32000
ONE_B = {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn": 8192}
EIGHT_B = {"hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336}
SMALL = {"hidden": 1024, "heads": 16, "kv_heads": 8, "ffn": 4096}
THREE_B = {"layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn": 8192}
POINTS = [
    # the three runs of reference/measured_h100.md
    Point("m1", **ONE_B, vocab=V128, seq=4096, mbs=2, ga=4),
    Point("m2", **ONE_B, vocab=V128, seq=2048, mbs=8, ga=2),
    Point("m3", layers=8, **EIGHT_B, vocab=V128, seq=4096, mbs=1, ga=8),
    # a spread of widths, depths, sequence lengths, batches and vocabularies
    Point("s1", layers=8, **SMALL, vocab=V32, seq=8192, mbs=1, ga=1),
    Point("s2", layers=24, **SMALL, vocab=V32, seq=2048, mbs=8, ga=2),
    Point("s3", **{**ONE_B, "layers": 4}, vocab=V32, seq=1024, mbs=4, ga=2),
    Point("s4", **{**ONE_B, "layers": 32}, vocab=V128, seq=8192, mbs=1, ga=2),
    Point("s5", **THREE_B, vocab=V128, seq=4096, mbs=2, ga=2),
    Point("s6", **THREE_B, vocab=V32, seq=2048, mbs=4, ga=1),
    Point("s7", layers=16, **EIGHT_B, vocab=V32, seq=2048, mbs=4, ga=2),
    Point("s8", layers=4, **EIGHT_B, vocab=V128, seq=8192, mbs=4, ga=2),
    Point("s9", layers=32, **EIGHT_B, vocab=V128, seq=1024, mbs=1, ga=2),
    Point("s10", layers=32, **EIGHT_B, vocab=V128, seq=4096, mbs=2, ga=2),
    Point("s11", layers=12, **SMALL, vocab=V128, seq=4096, mbs=8, ga=1),
    Point("s12", **{**ONE_B, "layers": 8}, vocab=V128, seq=8192, mbs=8, ga=1),
    # near an 80 GB H100's edge: the verdict turns on the reserve (b2)
    Point("b1", **ONE_B, vocab=V128, seq=5120, mbs=4, ga=2),
    Point("b2", **ONE_B, vocab=V128, seq=5376, mbs=4, ga=2),
    Point("b3", **ONE_B, vocab=V128, seq=5632, mbs=4, ga=2),
    Point("b4", layers=22, **EIGHT_B, vocab=V32, seq=4096, mbs=2, ga=2),
    # full activation checkpointing of every decoder layer
    Point("c1", **ONE_B, vocab=V128, seq=4096, mbs=2, ga=4, ckpt=True),
    Point("c2", **{**ONE_B, "layers": 32}, vocab=V128, seq=8192, mbs=4, ga=1, ckpt=True),
    Point("c3", layers=32, **EIGHT_B, vocab=V128, seq=2048, mbs=1, ga=2, ckpt=True),
    Point("c4", layers=24, **SMALL, vocab=V32, seq=8192, mbs=4, ga=2, ckpt=True),
]  # fmt: skip


def build(point: Point, device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The Hugging Face model (bf16, random init) and its fused AdamW on `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=point.hidden, intermediate_size=point.ffn, num_hidden_layers=point.layers,
        num_attention_heads=point.heads, num_key_value_heads=point.kv_heads,
        vocab_size=point.vocab, max_position_embeddings=point.seq, tie_word_embeddings=False,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # `.to(bf16)` cannot swap fake parameters
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.train()
    if point.ckpt:
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)({"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    return model, opt


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, ga: int,
          steps: int) -> None:  # fmt: skip
    """`steps` optimizer steps of `ga` micro-batches each, loss over all positions."""
    for _ in range(steps):
        for _ in range(ga):
            loss = model(input_ids=ids, labels=ids).loss / ga
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@contextmanager
def real_mask_decision() -> Iterator[None]:
    """Let transformers decide on the causal mask as it does for real tensors.

    Without a KV cache (training) it looks for packed sequences in the position ids, and
    it cannot read a FakeTensor's values: it then keeps a "packed" mask, builds a bf16
    [mbs, 1, seq, seq] mask and, with a mask, repeats K and V to every query head. With
    real position ids (0..seq-1 in every row) it finds no packing, skips the mask, and
    SDPA runs `is_causal=True` with `enable_gqa`; this returns that answer."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def tracked_peak(point: Point, record: bool = False, ga_cap: int = 2) -> LiveBytes:
    """The step's peak under `FakeTensorMode` on the CPU (two steps, at most `ga_cap`
    micro-batches each)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), real_mask_decision():
        model, opt = build(point, "cpu")
        ids = torch.randint(0, point.vocab, (point.mbs, point.seq))
        with LiveBytes(record=record) as live:
            live.track(model, opt, ids)
            train(model, opt, ids, min(point.ga, ga_cap), steps=2)
    return live


def cuda_peak(point: Point, steps: int = 3) -> float:
    """`torch.cuda.max_memory_allocated` (bytes) over `steps` real steps on this GPU, inf
    where the step runs out of memory. Nothing of an earlier point stays allocated but
    the cuBLAS workspace, which a fresh process allocates at its first GEMM too."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = opt = ids = None
    try:
        model, opt = build(point, "cuda")
        ids = torch.randint(0, point.vocab, (point.mbs, point.seq), device="cuda")
        train(model, opt, ids, point.ga, steps)
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated())
    except torch.OutOfMemoryError:
        return float("inf")
    finally:
        model = opt = ids = None
        gc.collect()
        torch.cuda.empty_cache()


def compare_with_tracked(points: list[Point], measured: dict[str, float]) -> None:
    """Measured minus tracked peak (MiB) of each point: what the tracker does not see
    (allocations inside CUDA ops, the cuBLAS workspace)."""
    print("| point | measured GiB | tracked GiB | measured - tracked MiB |\n|---|---:|---:|---:|")
    for p in points:
        tracked = tracked_peak(p).peak / GIB
        gap = (measured[p.name] - tracked) * 1024
        print(f"| {p.name} | {measured[p.name]:.2f} | {tracked:.2f} | {gap:+.0f} |")


def estimate(point: Point, profile: Profile | str = "pytorch") -> tuple[float, float]:
    """argosy's (allocated, total with the reserve) GiB per device on one H100."""
    plan = Parallel(mbs=point.mbs, recompute="full" if point.ckpt else "none", zero=0,
                    sp=False)  # fmt: skip
    group = load_cluster("h100:1").groups[0]
    costs, _ = estimate_one(point.spec(), group, point.seq, point.mbs * point.ga, plan,
                            None, profile)  # fmt: skip
    return float(costs.memory.allocated[0]) / GIB, float(costs.memory.total[0]) / GIB


def table(points: list[Point], peaks: dict[str, float], profile: Profile | str) -> list[float]:
    """Print the comparison of argosy's allocated and total (with its reserve) GiB with
    each peak (inf: the step ran out of memory); return the allocated estimate's errors."""
    capacity = load_cluster("h100:1").groups[0].chip.memory_gib
    print("| point | shape | peak GiB | argosy allocated | error | argosy total | "
          "OOM peak / argosy |\n|---|---|---:|---:|---:|---:|---|")  # fmt: skip
    errors, agree = [], 0
    for p in points:
        peak = peaks[p.name]
        alloc, total = estimate(p, profile)
        err = alloc / peak - 1 if math.isfinite(peak) else float("nan")
        if math.isfinite(peak):
            errors.append(err)
        oom = peak + CONTEXT_GIB > H100_USABLE_GIB
        called = total > capacity
        agree += oom == called
        verdict = f"{'OOM' if oom else 'fits'} / {'OOM' if called else 'fits'}"
        print(f"| {p.name} | {p.label()} | {peak:.2f} | {alloc:.2f} | {err:+.2%} | "
              f"{total:.2f} | {verdict} |")  # fmt: skip
    abs_err = np.abs(errors)
    print(f"median |error| {np.median(abs_err):.2%}, p90 {np.percentile(abs_err, 90):.2%}, "
          f"max {abs_err.max():.2%}; OOM agreement {agree}/{len(points)}")  # fmt: skip
    return errors


def with_logits(profile: Profile, per_vocab: float) -> Profile:
    """`profile` with its eager bytes per token and vocabulary entry at the loss."""
    memory = profile.memory.model_copy(update={"logits_bytes_per_vocab": per_vocab})
    return profile.model_copy(update={"memory": memory})


def before_issue_33(profile: Profile) -> Profile:
    """The pytorch profile's memory as it was: torchtitan's `eager` block accounting, 14
    loss bytes per token and vocabulary entry, gradients counted from the start."""
    update = {"activations": "eager", "lazy_grads": False, "logits_bytes_per_vocab": 14.0}
    return profile.model_copy(update={"memory": profile.memory.model_copy(update=update)})


def fit_logits(points: list[Point], peaks: dict[str, float]) -> tuple[float, list[float]]:
    """The one fitted number, bytes per token and vocabulary entry at the loss, on a grid
    by least squared log error of the allocated estimate against the tracked peaks; and
    each point's error when it is left out of the fit."""
    base = load_framework("pytorch")
    profiles = [with_logits(base, float(b)) for b in LOGITS_GRID]
    pred = np.array([[estimate(p, prof)[0] for p in points] for prof in profiles])
    tracked = np.array([peaks[p.name] for p in points])
    sq = np.log(pred / tracked) ** 2
    best = float(LOGITS_GRID[np.argmin(sq.sum(axis=1))])
    loo = []
    for i in range(len(points)):
        j = np.argmin(np.delete(sq, i, axis=1).sum(axis=1))
        loo.append(float(pred[j, i] / tracked[i] - 1))
    return best, loo


def write_json(path: Path, points: list[Point], peaks: dict, errors: list, device: str) -> None:
    """Measured peaks and argosy's errors, for scripts/gpu_parts.py's summary."""
    abs_err = np.abs(errors) if errors else np.array([float("nan")])
    doc = {
        "device": device,
        "peaks_gib": {p.name: peaks[p.name] for p in points},
        "median_abs_error": float(np.median(abs_err)),
        "max_abs_error": float(abs_err.max()),
    }
    path.write_text(json.dumps(doc, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["fake", "cuda"], default="fake")
    parser.add_argument("--points", default="", help="comma-separated names (default all)")
    parser.add_argument("--explain", default="", help="one point: the live bytes at its peak")
    parser.add_argument(
        "--before", action="store_true", help="the profile as it was before issue 33"
    )
    parser.add_argument("--json", type=Path, help="write the peaks and errors here")
    args = parser.parse_args()
    wanted = set(filter(None, args.points.split(",")))
    points = [p for p in POINTS if not wanted or p.name in wanted]
    profile = load_framework("pytorch")
    if args.before:
        profile = before_issue_33(profile)
    if args.explain:
        point = next(p for p in POINTS if p.name == args.explain)
        live = tracked_peak(point, record=True)
        print(f"{point.label()}: peak {live.peak / GIB:.3f} GiB at {live.peak_op}")
        for op, nbytes in sorted(live.peak_by_op.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {op:40s} {nbytes / GIB:8.3f} GiB")
        return
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device: skipped (run the fake-tensor tracker without --device)")
            return
        print(f"measured on {torch.cuda.get_device_name()}, torch {torch.__version__}")
        peaks = {p.name: cuda_peak(p) / GIB for p in points}
        errors = table(points, peaks, profile)
        compare_with_tracked(points, peaks)
        if args.json:
            write_json(args.json, points, peaks, errors, torch.cuda.get_device_name())
        return
    peaks = {p.name: tracked_peak(p).peak / GIB for p in points}
    print(f"tracked under FakeTensorMode on the CPU, torch {torch.__version__}")
    table(points, peaks, profile)
    best, loo = fit_logits(points, peaks)
    shipped = load_framework("pytorch").memory.logits_bytes_per_vocab
    print(f"fitted bytes per token and vocabulary entry: {best:g} (shipped {shipped:g})")
    for p, err in zip(points, loo, strict=True):
        print(f"  LOO {p.name:4s} {err:+.2%}")
    abs_loo = np.abs(loo)
    print(f"LOO median |error| {np.median(abs_loo):.2%}, p90 {np.percentile(abs_loo, 90):.2%}, "
          f"max {abs_loo.max():.2%}")  # fmt: skip


if __name__ == "__main__":
    main()
