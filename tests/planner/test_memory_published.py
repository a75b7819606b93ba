"""torchtitan's memory accounting against the peaks torchtitan published
(benchmarks/planner_memory.py holds the points, their source and the fit)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from argosy.planner.frameworks import load_framework

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "planner_memory.py"
_SPEC = importlib.util.spec_from_file_location("planner_memory", _PATH)
pm = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pm)


@pytest.mark.parametrize("point", pm.POINTS, ids=[p[0] for p in pm.POINTS])
def test_no_published_run_is_called_infeasible(point: tuple) -> None:
    gib, capacity = pm.predict(point, load_framework("torchtitan"))
    assert gib <= capacity


def test_fitted_points_within_three_percent_of_the_published_peaks() -> None:
    prof = load_framework("torchtitan")
    errors = [pm.predict(p, prof)[0] / p[6] - 1 for p in pm.POINTS if p[7]]
    assert np.median(np.abs(errors)) <= 0.01 and np.max(np.abs(errors)) <= 0.03


def test_the_shipped_profile_is_the_fit() -> None:
    """The profile's four numbers are what the grid fit finds on all the points."""
    fitted = [p for p in pm.POINTS if p[7]]
    terms = np.array([pm.linear_terms(p) for p in fitted])
    pred = pm.grid_predictions(terms, fitted)
    best = pm.settings()[pm.fit(pred, np.array([p[6] for p in fitted]), np.ones(len(fitted), bool))]
    prof = load_framework("torchtitan")
    shipped = [prof.selective.kept, prof.memory.compiled_activations,
               prof.memory.fp8_activations, prof.memory.logits_bytes_per_vocab]  # fmt: skip
    assert np.allclose(best, shipped, atol=1e-6)
