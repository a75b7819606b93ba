"""Published measurements, and how the cost model's predictions compare with them.

The points live in `data/calibration.yaml` (each with its source and FLOP convention).
`predict(point)` prices the published configuration; fields the source does not give
(micro-batch, interleaving, ...) are chosen by the planner, as the authors tuned them.
`measured_step_s(point)` converts the published figure to seconds per step under the
point's own FLOP convention, so every comparison is step time against step time.
Each point is priced under its framework profile (`point.framework`).

`fit_all(points)` fits the two scales (`compute`, `comm`) of every framework x chip
generation the points cover, plus one fit pooled over each generation (`any`);
`benchmarks/planner.py --fit` writes them to `data/calibrated.yaml`, and its
leave-one-source-out check calls `fit_all` without each source in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from argosy.core.documents import load_yaml, validate
from argosy.hardware.loader import load_cluster
from argosy.planner.efficiency import Constants, default_constants
from argosy.planner.frameworks import Profile, Scales, load_framework
from argosy.planner.models import ModelSpec, load_model
from argosy.planner.parallel import Parallel
from argosy.planner.search import search_group

CALIBRATION_PATH = Path(__file__).parent / "data" / "calibration.yaml"


class Point(BaseModel):
    """One published measurement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: str
    framework: str = "megatron-core"
    model: str
    cluster: str
    seq: int
    gbs: int
    parallel: dict[str, object]
    narayanan_tflops: float | None = None
    model_tflops: float | None = None
    mfu: float | None = None
    iteration_s: float | None = None
    tokens_per_s: float | None = None

    @property
    def spec(self) -> ModelSpec:
        return load_model(self.model)

    @property
    def devices(self) -> int:
        return load_cluster(self.cluster).num_devices


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    points: list[Point]


@cache
def points() -> tuple[Point, ...]:
    """Every calibration point shipped with argosy."""
    return tuple(validate(_File, load_yaml(CALIBRATION_PATH)).points)


def narayanan_flops(model: ModelSpec, seq: int, gbs: int) -> float:
    """96 B s l h^2 (1 + s/6h + V/16lh): SC'21's count, which includes full recompute."""
    h, l_ = model.hidden, model.layers
    return 96.0 * gbs * seq * l_ * h * h * (1 + seq / (6 * h) + model.vocab / (16 * l_ * h))


def measured_step_s(point: Point) -> float:
    """The published figure as seconds per step."""
    spec, n = point.spec, point.devices
    if point.iteration_s is not None:
        return point.iteration_s
    if point.tokens_per_s is not None:
        return point.gbs * point.seq / (point.tokens_per_s * n)
    if point.narayanan_tflops is not None:
        return narayanan_flops(spec, point.seq, point.gbs) / (point.narayanan_tflops * 1e12 * n)
    model_flops = 3.0 * spec.forward_flops_per_token(point.seq) * point.seq * point.gbs
    if point.model_tflops is not None:
        return model_flops / (point.model_tflops * 1e12 * n)
    assert point.mfu is not None, point.id
    peak = load_cluster(point.cluster).groups[0].chip.peak_tflops("bf16") * 1e12
    return model_flops / (point.mfu * peak * n)


@dataclass(frozen=True)
class Comparison:
    """Predicted against measured for one point."""

    point: Point
    plan: Parallel
    predicted_s: float
    measured_s: float
    feasible: bool

    @property
    def error(self) -> float:
        """Signed relative error of the predicted step time."""
        return self.predicted_s / self.measured_s - 1.0


def predict(
    point: Point,
    constants: Constants | None = None,
    scales: Scales | None = None,
    profile: Profile | None = None,
) -> Comparison:
    """Price the published configuration of `point` (unknown fields chosen by the planner)
    under its framework; `scales` and `profile` replace the fitted ones (for fitting)."""
    group = load_cluster(point.cluster).groups[0]
    kwargs = {
        "fixed": dict(point.parallel),
        "constants": constants,
        "framework": profile or point.framework,
        "scales": scales,
    }
    ranked = search_group(point.spec, group, point.seq, point.gbs, **kwargs)
    feasible = len(ranked) > 0
    if not feasible:
        ranked = search_group(
            point.spec, group, point.seq, point.gbs, include_infeasible=True, **kwargs
        )
    assert len(ranked), f"{point.id}: the published configuration is outside the search space"
    return Comparison(point, ranked.plan(0), ranked.step_s(0), measured_step_s(point), feasible)


def calibration_key(point: Point) -> tuple[str, str]:
    """(framework calibration key, chip generation) the point is fitted under."""
    chip = load_cluster(point.cluster).groups[0].chip.id
    return load_framework(point.framework).key, default_constants().generation(chip)


COMPUTE_GRID = tuple(float(x) for x in np.round(np.geomspace(0.6, 4.0, 49), 3))  # 4% steps
COMM_GRID = (0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)
MIN_POINTS_FOR_COMM = 4  # fewer points: fit the compute scale only


def _loss(pts: list[Point], scales: Scales) -> float:
    errors = np.abs(
        np.log([predict(p, scales=scales).predicted_s / measured_step_s(p) for p in pts])
    )
    return float(np.median(errors) + np.mean(errors))


def fit_group(pts: list[Point], compute: float | None = None, comm: float | None = None) -> Scales:
    """Compute and comm scales for points of one framework x chip generation, minimising
    the median plus mean absolute log error: a coarse grid over both (the two scales trade
    off along a ridge, so one at a time stalls), then a pattern search over neighbouring
    cells. With `compute` given (borrowed from the framework whose kernels these runs
    use), only comm is fitted; with `comm` given (too few points to tell the two apart:
    the generation's pooled comm), only compute; with neither and few points, compute
    with comm at 1.0."""
    base = Scales(points=len(pts), sources=sorted({p.source for p in pts}))
    computes = COMPUTE_GRID[::4] if compute is None else (compute,)
    if comm is not None:
        comms: tuple[float, ...] = (comm,)
    elif len(pts) >= MIN_POINTS_FOR_COMM or compute is not None:
        comms = COMM_GRID
    else:
        comms = (1.0,)
    trials = [base.model_copy(update={"compute": a, "comm": b}) for a in computes for b in comms]
    score, best = min(((_loss(pts, t), t) for t in trials), key=lambda st: st[0])
    if compute is None:
        best, score = _pattern_search(pts, best, score, comm_fixed=len(comms) == 1)
    return best


def _pattern_search(
    pts: list[Point], best: Scales, score: float, comm_fixed: bool = False
) -> tuple[Scales, float]:
    """Move to the best neighbouring (compute, comm) grid cell until none is better."""
    # the compute grid is finer than the comm grid: a comm step pairs with 0-3 compute steps
    steps = [(di, dj) for di in range(-3, 4) for dj in (-1, 0, 1) if (di or dj)]
    if comm_fixed:
        steps = [(-1, 0), (1, 0)]
    for _ in range(24):
        i = COMPUTE_GRID.index(best.compute)
        j = COMM_GRID.index(best.comm) if best.comm in COMM_GRID else None
        moves = []
        for di, dj in steps:
            if not 0 <= i + di < len(COMPUTE_GRID):
                continue
            update = {"compute": COMPUTE_GRID[i + di]}
            if dj:
                if j is None or not 0 <= j + dj < len(COMM_GRID):
                    continue
                update["comm"] = COMM_GRID[j + dj]
            moves.append(best.model_copy(update=update))
        trial_score, trial = min(((_loss(pts, m), m) for m in moves), key=lambda st: st[0])
        if trial_score >= score - 1e-9:
            break
        best, score = trial, trial_score
    return best, score


def fit_all(pts: list[Point] | None = None) -> dict[str, dict[str, Scales]]:
    """Fitted scales per calibration key and generation, plus `any` per generation: one
    fit pooled over every point of that generation, for pairs no published run covers.
    A group with too few multi-device runs to tell compute from comm takes the pooled
    comm."""
    pts = list(pts if pts is not None else points())
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in pts:
        groups.setdefault(calibration_key(p), []).append(p)
    pooled = {
        gen: fit_group([p for (_, g), members in groups.items() if g == gen for p in members])
        for gen in sorted({gen for _, gen in groups})
    }

    def few(members: list[Point], gen: str) -> float | None:
        """The pooled comm where too few runs communicate (one device has no collective)."""
        talking = [m for m in members if m.devices > 1]
        return pooled[gen].comm if len(talking) < MIN_POINTS_FOR_COMM else None

    out: dict[str, dict[str, Scales]] = {}
    borrowed: list[tuple[str, str, list[Point]]] = []
    for (key, gen), members in sorted(groups.items()):
        kernels = load_framework(members[0].framework).kernels
        if kernels and kernels != key:
            borrowed.append((key, gen, members))
            continue
        out.setdefault(key, {})[gen] = fit_group(members, comm=few(members, gen))
    for key, gen, members in borrowed:
        kernels = load_framework(members[0].framework).kernels
        own = out.get(kernels, {}).get(gen)
        if own is not None:
            out.setdefault(key, {})[gen] = fit_group(members, compute=own.compute)
        else:
            out.setdefault(key, {})[gen] = fit_group(members, comm=few(members, gen))
    out["any"] = pooled
    return out
