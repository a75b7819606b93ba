"""Published measurements, and how the cost model's predictions compare with them.

The points live in `data/calibration.yaml` (each with its source and FLOP convention).
`predict(point)` prices the published configuration; fields the source does not give
(micro-batch, interleaving, ...) are chosen by the planner, as the authors tuned them.
`measured_step_s(point)` converts the published figure to seconds per step under the
point's own FLOP convention, so every comparison is step time against step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from argosy.core.documents import load_yaml, validate
from argosy.hardware.loader import load_cluster
from argosy.planner.efficiency import Constants
from argosy.planner.models import ModelSpec, load_model
from argosy.planner.parallel import Parallel
from argosy.planner.search import search_group

CALIBRATION_PATH = Path(__file__).parent / "data" / "calibration.yaml"


class Point(BaseModel):
    """One published measurement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: str
    model: str
    cluster: str
    seq: int
    gbs: int
    parallel: dict[str, object]
    narayanan_tflops: float | None = None
    model_tflops: float | None = None
    mfu: float | None = None
    iteration_s: float | None = None

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


def predict(point: Point, constants: Constants | None = None) -> Comparison:
    """Price the published configuration of `point` (unknown fields chosen by the planner)."""
    cluster = load_cluster(point.cluster)
    group = cluster.groups[0]
    fixed = dict(point.parallel)
    ranked = search_group(point.spec, group, point.seq, point.gbs, fixed=fixed, constants=constants)
    feasible = len(ranked) > 0
    if not feasible:
        ranked = search_group(
            point.spec,
            group,
            point.seq,
            point.gbs,
            fixed=fixed,
            constants=constants,
            include_infeasible=True,
        )
    assert len(ranked), f"{point.id}: the published configuration is outside the search space"
    return Comparison(point, ranked.plan(0), ranked.step_s(0), measured_step_s(point), feasible)
