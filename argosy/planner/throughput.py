"""Effective throughput of a model on a chip, relative to a reference chip.

`relative_speed(model, chip)` prices the model on one scale-up domain (8 devices for
most chips) of `chip`, with the best plan the search finds, and divides its tokens/s
per device by the same figure on `reference` (H100 SXM). Models too large for one
domain are priced on the smallest power-of-two group of domains they fit in.
Cached per (model, chip, seq_len); pure and torch-free.
"""

from __future__ import annotations

from functools import lru_cache

from argosy.hardware.catalog import default_catalog
from argosy.hardware.cluster import ClusterSpec, NodeGroupSpec, resolve
from argosy.planner.models import ModelSpec, load_model
from argosy.planner.search import search_group

REFERENCE_CHIP = "h100-sxm"


def tokens_per_s_per_device(model: ModelSpec | str, chip: str, seq_len: int = 4096) -> float:
    """Best predicted tokens/s per device of `model` on `chip` (0 if it never fits)."""
    spec = load_model(model) if isinstance(model, str) else model
    return _tokens(spec, default_catalog().canonical(chip), seq_len)


def relative_speed(
    model: ModelSpec | str, chip: str, seq_len: int = 4096, reference: str = REFERENCE_CHIP
) -> float:
    """Tokens/s per device on `chip` over the same on `reference` (1.0 = as fast)."""
    ref = tokens_per_s_per_device(model, reference, seq_len)
    return tokens_per_s_per_device(model, chip, seq_len) / ref if ref else 0.0


@lru_cache(maxsize=1024)
def _tokens(model: ModelSpec, chip: str, seq_len: int) -> float:
    domain = default_catalog().get(chip).link.domain_size
    devices = max(1, min(domain, 8))
    for _ in range(8):
        spec = ClusterSpec(groups=(NodeGroupSpec(chip=chip, count=devices),))
        group = resolve(spec).groups[0]
        samples = 8 * devices
        ranked = search_group(model, group, seq_len, samples)
        if len(ranked):
            return samples * seq_len / ranked.step_s(0) / devices
        devices *= 2
    return 0.0
