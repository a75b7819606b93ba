"""The planner on published runs that are not in its calibration set (never fitted on).

    python benchmarks/planner_unfitted.py

Points from shared/reference/planner_calibration_more.json that calibration.yaml leaves
out, each priced under megatron-core with the published layout (fields a source does not
give are chosen by the planner, as for calibration points) and compared step time against
step time. OPT-175B's "up to 147 TFLOP/s" is an upper bound with no stated convention, so
it is not scored. Prints one row per run and the median / max absolute error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from argosy.planner.calibration import Point, predict  # noqa: E402
from argosy.planner.parallel import recompute_label  # noqa: E402

POINTS = [
    Point(  # Touvron et al. 2023, Sec. 2.4: ~380 tokens/s/GPU, 2,048 A100, 4M-token batch
        id="llama1-65b-2048", source="llama1", framework="megatron-lm",
        model="layers=80,hidden=8192,heads=64,ffn=22016,vocab=32000,gated=1",
        cluster="a100-80g:2048", seq=2048, gbs=2048, parallel={}, tokens_per_s=380,
    ),
    Point(  # Megatron-Bridge 25.11 DGX-H100 table, bf16, force-balanced routing
        id="gptoss-120b-h100-64", source="mbridge-2511", framework="megatron-core",
        model="layers=36,hidden=2880,heads=64,kv_heads=8,ffn=2880,moe_ffn=2880,"
        "vocab=201088,gated=1,experts=128,top_k=4",
        cluster="h100:64", seq=4096, gbs=512,
        parallel={"tp": 1, "pp": 4, "dp": 16, "ep": 8, "mbs": 4, "vpp": 1}, tokens_per_s=5630,
    ),
    Point(  # Megatron-Bridge 25.09 DGX-H100, DeepSeek-V3 dropless, fp8 blockwise
        id="dsv3-h100-1024-fp8", source="mbridge-2509", framework="megatron-core",
        model="deepseek-v3-like", cluster="h100:1024", seq=4096, gbs=8192,
        parallel={"tp": 2, "pp": 8, "dp": 64, "ep": 64, "vpp": 4, "mbs": 1, "fp8": True},
        tokens_per_s=1297,
    ),
    Point(  # DeepSeek-V3 report: 180k H800 GPU-hours per trillion tokens, pp16 ep64 ZeRO-1
        id="dsv3-h800-2048", source="dsv3", framework="megatron-core",
        model="deepseek-v3-like", cluster="h800:2048", seq=4096, gbs=15360,
        parallel={"tp": 1, "pp": 16, "dp": 128, "ep": 64, "zero": 1, "fp8": True},
        tokens_per_s=1543,
    ),
]  # fmt: skip


def main() -> None:
    print("| run | chips | plan (recompute chosen) | measured s | argosy s | error |")
    print("|---|---|---|---:|---:|---:|")
    errors = []
    for point in POINTS:
        c = predict(point)
        p = c.plan
        plan = f"tp{p.tp} pp{p.pp} vpp{p.vpp} dp{p.dp} ep{p.ep} mbs{p.mbs} "
        plan += recompute_label(p.recompute, p.recompute_layers)
        errors.append(abs(c.error))
        print(
            f"| {point.id} | {point.cluster} | {plan} | {c.measured_s:.2f} | "
            f"{c.predicted_s:.2f} | {c.error:+.1%} |"
        )
    print(f"\nmedian |error| {np.median(errors):.1%}, max {max(errors):.1%}")


if __name__ == "__main__":
    main()
