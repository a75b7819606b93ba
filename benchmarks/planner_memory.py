"""Fit torchtitan's memory accounting to the peaks torchtitan published, leave-one-out.

    python benchmarks/planner_memory.py            # fit, LOO errors, feasibility check

Points: torchtitan benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan, end of
2024): Llama 3.1 8B on 8 and 128 H100 (96 GB HBM2e, Grand Teton), FSDP, selective AC,
local batch 2, seq 8192, eager / torch.compile / +Float8 (Tables 1, 3), and FSDP+CP with
full AC at 32k tokens per device (Table 2); "Memory(GiB)" is the maximum over ranks of
torchtitan's memory monitor (reserved). Larger-model rows (70B, 405B: Tables 4-6) are
kept as feasibility checks only: their full-AC activations are a small share, so they
carry no information on the fitted parameters.

Fitted, four numbers for the whole profile (no per-point terms): the share of a layer's
activation bytes selective AC keeps (`selective.kept`), the share torch.compile keeps
(`memory.compiled_activations`), the share Float8 linears keep (`memory.fp8_activations`)
and the bytes per token and vocabulary entry at the loss (`memory.logits_bytes_per_vocab`;
those runs compiled the blocks, not the loss, so compiled runs use the same bytes). The
prediction compared is argosy's per-device total with its allocator reserve, the model's
counterpart of a reserved peak.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from argosy.hardware.loader import load_cluster  # noqa: E402
from argosy.planner.frameworks import load_framework  # noqa: E402
from argosy.planner.memory import GIB  # noqa: E402
from argosy.planner.models import load_model  # noqa: E402
from argosy.planner.parallel import Parallel  # noqa: E402
from argosy.planner.search import estimate_one  # noqa: E402

DEVICE_GIB = 96e9 / GIB  # the published runs' H100s: 96 GB HBM2e
SAC = {"recompute": "selective", "zero": 3, "mbs": 2}
FULL = {"recompute": "full", "zero": 3, "mbs": 1, "compile": True, "fp8": True}
# (id, model, devices, seq, global batch, layout, published GiB, fitted on)
POINTS = [
    ("t1-fsdp", "llama3-8b", 8, 8192, 16, {**SAC, "dp": 8}, 82.4, True),
    ("t1-compile", "llama3-8b", 8, 8192, 16, {**SAC, "dp": 8, "compile": True}, 77.0, True),
    ("t1-float8", "llama3-8b", 8, 8192, 16, {**SAC, "dp": 8, "compile": True, "fp8": True},
     76.8, True),
    ("t3-fsdp", "llama3-8b", 128, 8192, 256, {**SAC, "dp": 128}, 67.0, True),
    ("t3-compile", "llama3-8b", 128, 8192, 256, {**SAC, "dp": 128, "compile": True}, 62.0, True),
    ("t3-float8", "llama3-8b", 128, 8192, 256,
     {**SAC, "dp": 128, "compile": True, "fp8": True}, 61.8, True),
    ("t2-cp1", "llama3-8b", 8, 32768, 8, {**FULL, "dp": 8}, 83.9, True),
    ("t2-cp2", "llama3-8b", 8, 65536, 4, {**FULL, "dp": 4, "cp": 2}, 84.2, True),
    ("t2-cp4", "llama3-8b", 8, 131072, 2, {**FULL, "dp": 2, "cp": 4}, 84.0, True),
    ("t2-cp8", "llama3-8b", 8, 262144, 1, {**FULL, "dp": 1, "cp": 8}, 84.5, True),
    ("t4-2d", "llama3-70b", 256, 8192, 512, {**FULL, "mbs": 16, "tp": 8, "dp": 32}, 71.9, False),
    ("t5-1f1b", "llama3-405b", 512, 8192, 256, {**FULL, "tp": 8, "pp": 8, "dp": 8}, 82.5, False),
    ("t5-interleaved", "llama3-405b", 512, 8192, 256,
     {**FULL, "tp": 8, "pp": 8, "vpp": 2, "dp": 8}, 72.7, False),
]  # fmt: skip
GRID = {
    "kept": np.arange(0.20, 0.81, 0.02),
    "compiled": np.arange(0.40, 1.01, 0.02),
    "fp8": np.arange(0.60, 1.01, 0.05),
    "logits": np.arange(8.0, 20.01, 0.5),
}


def profile(kept: float, compiled: float, fp8: float, logits: float):
    base = load_framework("torchtitan")
    memory = base.memory.model_copy(
        update={"compiled_activations": compiled, "fp8_activations": fp8,
                "logits_bytes_per_vocab": logits, "compiled_logits_bytes_per_vocab": None}
    )  # fmt: skip
    selective = base.selective.model_copy(update={"kept": kept})
    return base.model_copy(update={"memory": memory, "selective": selective})


def predict(point: tuple, prof) -> tuple[float, float]:
    """(total GiB per device with the reserve, capacity GiB) of one point."""
    _, model, devices, seq, gbs, layout, _, _ = point
    p = Parallel(**{"sp": layout.get("tp", 1) > 1, **layout})
    group = load_cluster(f"h100:{devices}").groups[0]
    costs, _ = estimate_one(load_model(model), group, seq, gbs, p, None, prof)
    return float(costs.memory_gib[0]), DEVICE_GIB


def linear_terms(point: tuple) -> np.ndarray:
    """The prediction is states + act * kept^[selective] * compiled^[compile] *
    fp8^[fp8] + logits * bytes: columns (states, act, logits per byte), read off the
    cost model by scaling the factors that apply."""
    layout = point[5]
    n = (layout["recompute"] == "selective") + layout.get("compile", False)
    n += layout.get("fp8", False) and layout["recompute"] != "full"  # full AC keeps inputs
    no_logits = predict(point, profile(1.0, 1.0, 1.0, 1e-9))[0]
    half = predict(point, profile(0.5, 0.5, 0.5, 1e-9))[0]
    act = (no_logits - half) / (1 - 0.5**n) if n else 0.0
    per_byte = predict(point, profile(1.0, 1.0, 1.0, 1.0))[0] - no_logits
    return np.array([no_logits - act, act, per_byte])


def grid_predictions(terms: np.ndarray, points: list[tuple]) -> np.ndarray:
    """Predicted GiB of every point at every grid setting: (settings, points)."""
    k, c, f, b = (a.ravel() for a in np.meshgrid(*GRID.values(), indexing="ij"))
    sel = np.array([p[5]["recompute"] == "selective" for p in points])
    comp = np.array([p[5].get("compile", False) for p in points])
    fp8 = np.array([p[5].get("fp8", False) and p[5]["recompute"] != "full" for p in points])
    act = np.where(sel, k[:, None], 1.0) * np.where(comp, c[:, None], 1.0)
    act = act * np.where(fp8, f[:, None], 1.0)
    return terms[:, 0] + terms[:, 1] * act + terms[:, 2] * b[:, None]


def settings() -> np.ndarray:
    return np.array(list(itertools.product(*GRID.values())))


def fit(pred: np.ndarray, measured: np.ndarray, keep: np.ndarray) -> int:
    """Index of the grid setting with the least squared log error on `keep`."""
    err = np.log(pred[:, keep] / measured[keep])
    return int(np.argmin((err**2).sum(axis=1)))


def main() -> None:
    fitted_on = [p for p in POINTS if p[7]]
    terms = np.array([linear_terms(p) for p in fitted_on])
    pred = grid_predictions(terms, fitted_on)
    measured = np.array([p[6] for p in fitted_on])
    grid = settings()
    everything = np.ones(len(fitted_on), dtype=bool)
    best = fit(pred, measured, everything)
    print("fitted on all:", dict(zip(GRID, np.round(grid[best], 3), strict=True)))
    loo = []
    for i, point in enumerate(fitted_on):
        keep = everything.copy()
        keep[i] = False
        j = fit(pred, measured, keep)
        loo.append(pred[j, i] / measured[i] - 1)
        print(f"  LOO {point[0]:16s} published {measured[i]:5.1f}  predicted {pred[j, i]:5.1f}"
              f"  error {loo[-1]:+.1%}")  # fmt: skip
    print(f"LOO median |error| {np.median(np.abs(loo)):.1%}, max {np.max(np.abs(loo)):.1%}")
    now = load_framework("torchtitan")
    print("profile now:", now.selective.kept, now.memory.compiled_activations,
          now.memory.fp8_activations, now.memory.logits_bytes_per_vocab)  # fmt: skip
    for point in POINTS:
        gib, cap = predict(point, now)
        verdict = "fits" if gib <= cap else "CALLED INFEASIBLE"
        print(f"  {point[0]:16s} published {point[6]:5.1f}  argosy {gib:5.1f}  "
              f"ratio {gib / point[6]:.2f}  {verdict} on a {cap:.1f} GiB device")  # fmt: skip


if __name__ == "__main__":
    main()
