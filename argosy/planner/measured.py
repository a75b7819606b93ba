"""Kernel costs read from measured hardware tables (argosy/hardware/measured/).

Contract: `tables_for(chip_id)` returns the `Measured` costs of a chip that has a table
(or shares silicon with one, through `efficiency.yaml`'s `like`), else None. Loading is
cached and torch-free. What a `Measured` gives, all vectorised over numpy arrays:

- `gemm_eff(m, n, k)`: forward+backward efficiency of a linear layer (m tokens, weight
  n x k), a curve eff = emax * g(m; m0, am) * g(n; d0, ad) * g(k; d0, ad) with
  g(x; x0, a) = 1 / (1 + (x0/x)^a), least-squares fitted in log space to the table's
  `linear` rows when first used;
- `fp8_speedup(m, n, k)`: bf16 time over fp8 time of the same GEMM (table `fp8_linear`
  rows against the bf16 rows of the same shape; a median, used as one factor);
- `attn_eff(seq)`: forward+backward efficiency of causal flash attention counting causal
  FLOPs, interpolated in log(seq) from the `sdpa_causal` rows;
- seconds per element of the memory-bound ops of a step (RMSNorm, eager SwiGLU,
  cross-entropy with the fp32 upcast, forward+backward) and of fused AdamW per parameter,
  and the device-to-device copy bandwidth.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from argosy.core.documents import load_yaml

MEASURED_DIR = Path(__file__).resolve().parents[1] / "hardware" / "measured"


@dataclass(frozen=True)
class GemmCurve:
    """eff = emax * g(m; m0, am) * g(n; d0, ad) * g(k; d0, ad)."""

    emax: float
    m0: float
    am: float
    d0: float
    ad: float

    def __call__(self, m, n, k) -> np.ndarray:
        def g(x, x0, a):
            return 1.0 / (1.0 + (x0 / np.maximum(np.asarray(x, dtype=np.float64), 1.0)) ** a)

        return self.emax * g(m, self.m0, self.am) * g(n, self.d0, self.ad) * g(k, self.d0, self.ad)


@dataclass(frozen=True)
class Measured:
    """Kernel costs of one chip, from its measured table."""

    chip_id: str
    machine: str
    gemm: GemmCurve
    fp8_factor: float
    attn_seq: np.ndarray
    attn_eff_values: np.ndarray
    rmsnorm_s_per_elem: float
    swiglu_s_per_elem: float
    ce_s_per_elem: float
    adamw_s_per_param_bf16: float
    adamw_s_per_param_fp32: float
    copy_bps: float

    def gemm_eff(self, m, n, k) -> np.ndarray:
        return self.gemm(m, n, k)

    def attn_eff(self, seq) -> np.ndarray:
        """Causal flash attention fwd+bwd efficiency at sequence length `seq` (causal FLOPs)."""
        x = np.log2(np.maximum(np.asarray(seq, dtype=np.float64), 1.0))
        return np.interp(x, np.log2(self.attn_seq), self.attn_eff_values)


@cache
def _index() -> dict[str, dict]:
    return dict(load_yaml(MEASURED_DIR / "index.yaml").data["tables"])


def measured_chips() -> tuple[str, ...]:
    """Chip ids that have a measured table."""
    return tuple(sorted(_index()))


@cache
def tables_for(chip_id: str) -> Measured | None:
    """The measured costs of `chip_id`, or None when it has no table."""
    entry = _index().get(chip_id)
    if entry is None:
        return None
    rows = [json.loads(line) for line in (MEASURED_DIR / entry["file"]).read_text().splitlines()]
    return _build(chip_id, str(entry.get("machine", "")), [r for r in rows if "error" not in r])


def _build(chip_id: str, machine: str, rows: list[dict]) -> Measured:
    def kind(name: str) -> list[dict]:
        return [r for r in rows if r["kind"] == name]

    linear = kind("linear")
    sdpa = sorted((r for r in kind("sdpa_causal") if r["heads"] == 32), key=lambda r: r["seq"])
    norm = max(kind("rmsnorm"), key=lambda r: r["tokens"] * r["hidden"])
    swiglu = max(kind("swiglu_eager"), key=lambda r: r["tokens"] * r["ffn"])
    ce = max(kind("cross_entropy_fp32_upcast"), key=lambda r: r["tokens"] * r["vocab"])
    adam = {r["dtype"]: r for r in kind("adamw_fused")}
    copy = kind("copy")[0]
    return Measured(
        chip_id=chip_id,
        machine=machine,
        gemm=fit_gemm_curve(linear),
        fp8_factor=_fp8_factor(linear, kind("fp8_linear")),
        attn_seq=np.array([r["seq"] for r in sdpa], dtype=np.float64),
        attn_eff_values=np.array([r["fwd_bwd_eff"] for r in sdpa], dtype=np.float64),
        rmsnorm_s_per_elem=norm["fwd_bwd_ms"] * 1e-3 / (norm["tokens"] * norm["hidden"]),
        swiglu_s_per_elem=swiglu["fwd_bwd_ms"] * 1e-3 / (swiglu["tokens"] * swiglu["ffn"]),
        ce_s_per_elem=ce["fwd_bwd_ms"] * 1e-3 / (ce["tokens"] * ce["vocab"]),
        adamw_s_per_param_bf16=adam["torch.bfloat16"]["ns_per_param"] * 1e-9,
        adamw_s_per_param_fp32=adam["torch.float32"]["ns_per_param"] * 1e-9,
        copy_bps=float(copy["bytes_per_s"]),
    )


def fit_gemm_curve(linear: list[dict]) -> GemmCurve:
    """Fit the GEMM curve to `linear` rows (forward+backward efficiency), minimising the
    median plus a third of the mean absolute log error over a grid of shape parameters
    (emax is the closed-form median for each)."""
    m, n, k = (np.array([r[key] for r in linear], dtype=np.float64) for key in ("m", "n", "k"))
    y = np.log(np.array([r["fwd_bwd_eff"] for r in linear], dtype=np.float64))
    best: tuple[float, GemmCurve] | None = None
    grid = itertools.product(
        (128.0, 192.0, 256.0, 320.0, 384.0), (1.5, 2.0, 3.0, 4.0), (16.0, 64.0, 128.0, 256.0),
        (1.0, 2.0, 3.0),
    )  # fmt: skip
    for m0, am, d0, ad in grid:
        shape = np.log(GemmCurve(1.0, m0, am, d0, ad)(m, n, k))
        log_emax = float(np.median(y - shape))
        err = np.abs(shape + log_emax - y)
        score = float(np.median(err) + np.mean(err) / 3.0)
        if best is None or score < best[0]:
            best = (score, GemmCurve(float(np.exp(log_emax)), m0, am, d0, ad))
    assert best is not None
    return best[1]


def _fp8_factor(linear: list[dict], fp8: list[dict]) -> float:
    """Median of bf16 forward time over fp8 forward time on shapes measured both ways."""
    bf16 = {(r["layer"], r["m"]): r["fwd_ms"] for r in linear}
    ratios = [bf16[(r["layer"], r["m"])] / r["fwd_ms"] for r in fp8 if (r["layer"], r["m"]) in bf16]
    return float(np.median(ratios)) if ratios else 1.0
