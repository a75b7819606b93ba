"""Planner benchmark: accuracy against published runs, plan quality, search time, and
mixed-chip efficiency. Prints markdown tables (paste into benchmarks/RESULTS.md).

    .venv/bin/python benchmarks/planner.py            # everything
    .venv/bin/python benchmarks/planner.py --fit      # refit constants (coordinate descent)
    .venv/bin/python benchmarks/planner.py --holdout  # refit without one source, test on it

Peers side by side: the cost model against "dense peak x one MFU constant" (the best
single constant for the whole set, i.e. the baseline a calculator such as llm-analysis
gives when it is handed one efficiency).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from argosy.hardware.loader import load_cluster
from argosy.planner.api import plan as run_plan
from argosy.planner.calibration import Comparison, points, predict
from argosy.planner.efficiency import Constants, default_constants
from argosy.planner.hetero import plan_mixed
from argosy.planner.layersplit import plan_layer_split
from argosy.planner.models import load_model
from argosy.planner.search import search_group

SEARCH_CASES = [
    ("llama3-405b", "h100:16384", 8192, 2048),
    ("llama3-405b", "h100:4096+a100:4096+910b:3840", 8192, 2048),
]
MIXES = [
    ("llama3-8b", "a100:32+h100:32+910b:40", 4096, 256),
    ("llama3-8b", "h100:64+h20:32", 4096, 512),
    ("llama3-70b", "a100:64+h100:48", 4096, 512),
    ("mixtral-8x7b", "h100:64+910b:64", 4096, 512),
    ("llama3-70b", "a100:4096+h100:4096+910b:3840", 4096, 4096),
    ("gpt3-175b", "h100:5120+910b:5120", 2048, 3072),
    ("llama3-405b", "h100:8192+a100:4096", 8192, 2048),
    ("deepseek-v3-like", "h100:6144+h20:4096", 4096, 4096),
]


def accuracy(constants: Constants | None = None) -> list[Comparison]:
    return [predict(p, constants) for p in points()]


def baseline_errors(comps: list[Comparison]) -> np.ndarray:
    """Errors of dense peak x the single best MFU constant."""
    ideal = []
    for c in comps:
        p = c.point
        flops = 3 * p.spec.forward_flops_per_token(p.seq) * p.seq * p.gbs
        peak = load_cluster(p.cluster).groups[0].chip.peak_tflops() * 1e12 * p.devices
        ideal.append(flops / peak)
    ratio = np.array(ideal) / np.array([c.measured_s for c in comps])
    constant = np.median(ratio)
    return np.abs(ratio / constant - 1)


def print_accuracy(comps: list[Comparison]) -> None:
    print(
        "| point | chips | published config (planner-chosen fields in *) "
        "| measured s | predicted s | error |"
    )
    print("|---|---|---|---:|---:|---:|")
    for c in comps:
        given = set(c.point.parallel)
        cfg = " ".join(
            f"{k}={v}" if k in given else f"*{k}={v}"
            for k, v in c.plan.as_dict().items()
            if k in ("tp", "pp", "dp", "vpp", "cp", "mbs", "recompute", "zero")
        )
        print(
            f"| {c.point.id} | {c.point.cluster} | {cfg} | {c.measured_s:.2f} | "
            f"{c.predicted_s:.2f} | {c.error:+.1%} |"
        )
    err = np.abs([c.error for c in comps])
    base = baseline_errors(comps)
    print(
        f"\nabs error over {len(comps)} points: median {np.median(err):.1%}, "
        f"worst {err.max():.1%}, "
        f"mean {err.mean():.1%}"
    )
    print(
        f"peer (peak x best single MFU constant): median {np.median(base):.1%}, "
        f"worst {base.max():.1%}"
    )
    for chip in sorted({c.point.cluster.split(":")[0] for c in comps}):
        sub = np.abs([c.error for c in comps if c.point.cluster.startswith(chip)])
        print(f"  {chip}: {len(sub)} points, median {np.median(sub):.1%}, worst {sub.max():.1%}")


def print_plan_quality(comps: list[Comparison]) -> None:
    print("\n| point | published predicted s | best plan s | speed-up | best plan |")
    print("|---|---:|---:|---:|---|")
    ratios = []
    for c in comps:
        p = c.point
        fixed = {"flash": p.parallel["flash"]} if "flash" in p.parallel else None
        ranked = search_group(p.spec, load_cluster(p.cluster).groups[0], p.seq, p.gbs, fixed=fixed)
        best = ranked.step_s(0)
        ratios.append(c.predicted_s / best)
        plan = ranked.plan(0)
        short = (
            f"tp{plan.tp} pp{plan.pp} vpp{plan.vpp} dp{plan.dp} cp{plan.cp} "
            f"mbs{plan.mbs} {plan.recompute} z{plan.zero}"
        )
        note = "" if c.feasible else " (published config over memory in our model)"
        print(
            f"| {p.id} | {c.predicted_s:.2f}{note} | {best:.2f} | "
            f"{c.predicted_s / best:.2f}x | {short} |"
        )
    print(
        f"\nbest plan at least as fast as published on "
        f"{sum(r >= 1 - 1e-9 for r in ratios)}/{len(ratios)} points; "
        f"median speed-up {statistics.median(ratios):.2f}x"
    )


def print_search_times(repeats: int = 3) -> None:
    print("\n| model | cluster | devices | candidates | median s | runs |")
    print("|---|---|---:|---:|---:|---|")
    for model, cluster, seq, gbs in SEARCH_CASES:
        spec, clus = load_model(model), load_cluster(cluster)
        times, cands = [], 0
        for _ in range(repeats):
            started = time.perf_counter()
            result = run_plan(spec, clus, seq, gbs)
            times.append(time.perf_counter() - started)
            cands = result["search"]["candidates"]
        runs = ", ".join(f"{t:.2f}" for t in times)
        print(
            f"| {model} | {cluster} | {clus.num_devices} | {cands:,} | "
            f"{statistics.median(times):.2f} | {runs} |"
        )


def print_mixed() -> None:
    print(
        "\n| model | cluster | devices | batch | batch split: shares | step s | sync s "
        "| layer split: stages:layers per chip | step s | efficiency (best) |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|---:|---:|")
    for model, cluster, seq, gbs in MIXES:
        spec, clus = load_model(model), load_cluster(cluster)
        mixed = plan_mixed(spec, clus, seq, gbs)
        split = plan_layer_split(spec, clus, seq, gbs)
        shares = "/".join(str(p.samples) for p in mixed.parts)
        best = min(mixed.step_s, split.step_s if split else float("inf"))
        layers = "/".join(f"{g.stages}:{g.layers}" for g in split.groups) if split else "-"
        split_s = f"{split.step_s:.3f}" if split else "-"
        efficiency = mixed.efficiency() * mixed.step_s / best
        print(
            f"| {model} | {cluster} | {clus.num_devices} | {gbs} | {shares} | {mixed.step_s:.3f} | "
            f"{mixed.sync_s:.4f} | {layers} | {split_s} | {efficiency:.3f} |"
        )


GRID = {
    "gemm_max": [0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9],
    "gemm_half_gflop": [0.125, 0.25, 0.5, 1.0, 1.5, 2.0, 4.0],
    "dim_half": [0, 16, 32, 48, 64, 96, 128],
    "attn_eff": [0.3, 0.35, 0.4, 0.45, 0.5, 0.6],
}
FRAMEWORK_GRID = {
    "backward_factor": [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3],
    "elementwise_passes": [8, 12, 16, 24, 32],
    "score_passes": [2, 3, 4, 6, 8],
}
MIN_POINTS_FOR_SHAPE = 8  # with fewer points, fit only gemm_max (one number per chip)


def _loss(pts, consts) -> float:
    err = np.abs([predict(p, consts).error for p in pts])
    return float(np.median(err) + 0.5 * err.max())


def fit(sweeps: int = 2) -> None:
    """Coordinate descent: framework constants and the richest chip's full set on that
    chip's points; every other chip only its gemm_max when it has few points."""
    base = default_constants()
    by_chip: dict[str, list] = {}
    for p in points():
        by_chip.setdefault(load_cluster(p.cluster).groups[0].chip.id, []).append(p)
    richest = max(by_chip, key=lambda c: len(by_chip[c]))
    for chip, pts in sorted(by_chip.items(), key=lambda kv: kv[0] != richest):
        grid = GRID if len(pts) >= MIN_POINTS_FOR_SHAPE else {"gemm_max": GRID["gemm_max"]}
        eff, fw = base.chip(chip), base.framework
        best = _loss(pts, base)
        for _ in range(sweeps):
            for key, values in grid.items():
                for value in values:
                    trial = eff.model_copy(update={key: value})
                    score = _loss(
                        pts, base.model_copy(update={"chips": {**base.chips, chip: trial}})
                    )
                    if score < best - 1e-6:
                        best, eff = score, trial
            if chip != richest:
                continue
            for key, values in FRAMEWORK_GRID.items():
                for value in values:
                    trial_fw = fw.model_copy(update={key: value})
                    consts = base.model_copy(
                        update={"chips": {**base.chips, chip: eff}, "framework": trial_fw}
                    )
                    score = _loss(pts, consts)
                    if score < best - 1e-6:
                        best, fw = score, trial_fw
        base = base.model_copy(update={"chips": {**base.chips, chip: eff}, "framework": fw})
        fields = ", ".join(f"{k}: {getattr(eff, k)}" for k in GRID)
        print(
            f"{chip} ({len(pts)} points, fitted {', '.join(grid)}): loss {best:.4f} -> {{{fields}}}"
        )
        if chip == richest:
            print("framework: " + ", ".join(f"{k}: {getattr(fw, k)}" for k in FRAMEWORK_GRID))


def holdout() -> None:
    """Leave one source out: refit the A100 constants on the other sources, test on it."""
    base = default_constants()
    a100 = [p for p in points() if load_cluster(p.cluster).groups[0].chip.id == "a100-80g"]
    print("| held-out source | points | fitted on | median error | worst error |")
    print("|---|---:|---|---:|---:|")
    for source in sorted({p.source for p in a100}):
        train = [p for p in a100 if p.source != source]
        test = [p for p in a100 if p.source == source]
        eff, fw = base.chip("a100-80g"), base.framework
        best = _loss(train, base)
        for _ in range(2):
            for key, values in GRID.items():
                for value in values:
                    trial = eff.model_copy(update={key: value})
                    consts = base.model_copy(
                        update={"chips": {**base.chips, "a100-80g": trial}, "framework": fw}
                    )
                    score = _loss(train, consts)
                    if score < best - 1e-6:
                        best, eff = score, trial
            for key, values in FRAMEWORK_GRID.items():
                for value in values:
                    trial_fw = fw.model_copy(update={key: value})
                    consts = base.model_copy(
                        update={"chips": {**base.chips, "a100-80g": eff}, "framework": trial_fw}
                    )
                    score = _loss(train, consts)
                    if score < best - 1e-6:
                        best, fw = score, trial_fw
        consts = base.model_copy(update={"chips": {**base.chips, "a100-80g": eff}, "framework": fw})
        err = np.abs([predict(p, consts).error for p in test])
        sources = ", ".join(sorted({p.source for p in train}))
        print(f"| {source} | {len(test)} | {sources} | {np.median(err):.1%} | {err.max():.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fit", action="store_true", help="refit per-chip constants and exit")
    parser.add_argument("--holdout", action="store_true", help="leave-one-source-out check")
    args = parser.parse_args()
    if args.fit:
        fit()
        return
    if args.holdout:
        holdout()
        return
    comps = accuracy()
    print_accuracy(comps)
    print_plan_quality(comps)
    print_search_times()
    print_mixed()


if __name__ == "__main__":
    main()
