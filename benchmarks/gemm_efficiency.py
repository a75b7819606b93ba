"""GEMM efficiency by shape on whatever device is present, beside the cost model's curve.

    .venv/bin/python benchmarks/gemm_efficiency.py                 # CUDA if present, else CPU
    .venv/bin/python benchmarks/gemm_efficiency.py --chip h100     # compare with that chip's curve
    .venv/bin/python benchmarks/gemm_efficiency.py --tables        # measured tables vs the fit

`--tables` needs no device: for every chip with a measured table (argosy/hardware/measured)
it prints the measured forward+backward efficiency of each linear-layer row beside the
curve the planner fitted to those rows and the parametric curve of efficiency.yaml, with
the median and 90th-percentile error of each.

For each (m, n, k) it times bf16 matmuls (fp32 on CPU), prints achieved TFLOPs, the
fraction of the chip's dense peak (when the chip is known) and the cost model's predicted
fraction from `argosy.planner.efficiency.gemm_efficiency`, side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from argosy.hardware.catalog import default_catalog
from argosy.planner.efficiency import default_constants, gemm_efficiency
from argosy.planner.measured import MEASURED_DIR, measured_chips, tables_for

GPU_SHAPES = [
    (2048, 1536, 12288),  # GPT-3 175B QKV per TP=8 rank, 1 sequence
    (2048, 12288, 1536),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (8192, 3584, 4096),  # Llama-3 8B MLP up per TP=4
    (8192, 28672, 8192),
    (1024, 1024, 1024),
    (512, 4096, 4096),
    (16384, 16384, 2048),
]
CPU_SHAPES = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 512, 2048)]


def print_tables() -> None:
    """Measured rows against the fitted and the parametric curve, per chip with a table."""
    for chip in measured_chips():
        measured = tables_for(chip)
        assert measured is not None
        lines = (MEASURED_DIR / f"{chip}.jsonl").read_text().splitlines()
        rows = [r for r in map(json.loads, lines) if r["kind"] == "linear" and "fwd_bwd_eff" in r]
        eff = default_constants().chip(chip)
        print(f"\n{chip}: {measured.machine}; fitted {measured.gemm}")
        print("| layer | m | n | k | measured | fitted curve | parametric |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        fit_err, par_err = [], []
        for r in rows:
            fitted = float(measured.gemm_eff(r["m"], r["n"], r["k"]))
            param = float(gemm_efficiency(eff, r["m"], r["n"], r["k"]))
            fit_err.append(abs(fitted / r["fwd_bwd_eff"] - 1))
            par_err.append(abs(param / r["fwd_bwd_eff"] - 1))
            if r["m"] in (512, 2048, 16384):
                print(
                    f"| {r['layer']} | {r['m']} | {r['n']} | {r['k']} | {r['fwd_bwd_eff']:.2f} "
                    f"| {fitted:.2f} | {param:.2f} |"
                )
        print(
            f"\n{chip}, {len(rows)} rows: fitted curve median error {np.median(fit_err):.1%}, "
            f"p90 {np.percentile(fit_err, 90):.1%}; parametric median {np.median(par_err):.1%}, "
            f"p90 {np.percentile(par_err, 90):.1%}"
        )


def time_gemm(m: int, n: int, k: int, device: str, dtype, repeats: int) -> float:
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        samples.append((time.perf_counter() - started) / 10)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chip", help="catalog chip to compare with (default: detected GPU)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tables", action="store_true", help="measured tables vs the fit")
    args = parser.parse_args()
    if args.tables:
        print_tables()
        return
    import torch

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = GPU_SHAPES if cuda else CPU_SHAPES
    chip = None
    if args.chip:
        chip = default_catalog().get(args.chip)
    elif cuda:
        chip = default_catalog().match_device(torch.cuda.get_device_name(0), "nvidia")
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(f"device: {name}; dtype {dtype}; chip for comparison: {chip.id if chip else 'none'}")
    print("| m | n | k | median ms | TFLOP/s | of peak | model predicts |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    eff = default_constants().chip(chip.id) if chip else None
    for m, n, k in shapes:
        seconds = time_gemm(m, n, k, device, dtype, args.repeats)
        tflops = 2 * m * n * k / seconds / 1e12
        of_peak = f"{tflops / chip.peak_tflops('bf16'):.1%}" if chip else "-"
        predicted = f"{float(gemm_efficiency(eff, m, n, k)):.1%}" if eff else "-"
        print(f"| {m} | {n} | {k} | {seconds * 1e3:.3f} | {tflops:.2f} | {of_peak} | {predicted} |")


if __name__ == "__main__":
    main()
