"""Prometheus text for `/metrics`: tokens, TTFT and TPOT quantiles, speculation acceptance,
and with a meter the service's energy (joules per generated token, average watts:
`energy_metrics`)."""

from __future__ import annotations

from argosy.serving.energy_metrics import ServingEnergy
from argosy.serving.types import EngineStats


def render_metrics(stats: EngineStats, energy: ServingEnergy | None = None) -> str:
    """The engine's counters in the Prometheus exposition format."""
    spec = stats.spec
    passes = spec.verify_passes
    lines = [
        _metric("argosy_serving_requests_total", "counter", stats.requests),
        _metric("argosy_serving_prompt_tokens_total", "counter", stats.prompt_tokens),
        _metric("argosy_serving_completion_tokens_total", "counter", stats.completion_tokens),
        _metric("argosy_serving_spec_drafted_tokens_total", "counter", spec.drafted),
        _metric("argosy_serving_spec_accepted_tokens_total", "counter", spec.accepted),
        _metric("argosy_serving_spec_verify_passes_total", "counter", passes),
        _metric("argosy_serving_spec_acceptance_rate", "gauge", spec.acceptance_rate),
        _metric(
            "argosy_serving_spec_tokens_per_verify_pass",
            "gauge",
            (spec.accepted + passes) / passes if passes else 0.0,
        ),
        _metric("argosy_serving_asleep", "gauge", int(stats.asleep)),
        _metric("argosy_serving_running_requests", "gauge", stats.running),
        _metric("argosy_serving_queue_depth", "gauge", stats.waiting),
        _metric(
            "argosy_serving_mean_batch_size",
            "gauge",
            stats.batched_tokens / stats.batched_steps if stats.batched_steps else 1.0,
        ),
        _quantiles("argosy_serving_ttft_seconds", stats.ttft_s),
        _quantiles("argosy_serving_tpot_seconds", stats.tpot_s),
        _metric("argosy_serving_prefill_chunks_total", "counter", stats.prefill_chunks),
        *_prefix_cache(stats),
        *_budget(stats),
    ]
    if energy is not None:
        lines.append(energy.metrics(stats.completion_tokens))
    return "\n".join(lines) + "\n"


def _prefix_cache(stats: EngineStats) -> list[str]:
    """The prefix cache's counters (`argosy_serving_prefix_cache_*`), when it is on."""
    kinds = {"cached_tokens": "gauge", "capacity_tokens": "gauge"}
    return [
        _metric(
            f"argosy_serving_prefix_cache_{name}{'' if name in kinds else '_total'}",
            kinds.get(name, "counter"),
            value,
        )
        for name, value in stats.prefix_cache.items()
    ]


def _budget(stats: EngineStats) -> list[str]:
    """The memory budget's figures and its use, when the engine has one."""
    if not stats.budget:
        return []
    names = ("memory_fraction", "budget_bytes", "weights_bytes", "kv_budget_bytes")
    lines = [_metric(f"argosy_serving_{name}", "gauge", stats.budget[name]) for name in names]
    capacity = stats.budget["kv_capacity_tokens"]
    lines += [
        _metric("argosy_serving_kv_capacity_tokens", "gauge", capacity),
        _metric("argosy_serving_kv_reserved_tokens", "gauge", stats.kv_reserved_tokens),
        _metric(
            "argosy_serving_kv_budget_used",
            "gauge",
            stats.kv_reserved_tokens / capacity if capacity else 0.0,
        ),
    ]
    return lines


def _metric(name: str, kind: str, value: float) -> str:
    return f"# TYPE {name} {kind}\n{name} {value}"


def _quantiles(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    rows = [f"# TYPE {name} summary"]
    for q in (0.5, 0.9, 0.99):
        value = ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
        rows.append(f'{name}{{quantile="{q}"}} {value}')
    rows.append(f"{name}_count {len(ordered)}")
    return "\n".join(rows)
