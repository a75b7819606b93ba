"""From per-rank probe samples to check results: pure, no torch, no processes.

For every per-device probe (gemm, memory, host_copy) each rank gets two checks:
`<probe>.rank<k>`, its best round's throughput against the chip's expectation, and, on a node
with two or more devices, `<probe>_peer.rank<k>`, its throughput over the median of its
peers measured in the same rounds (expected 1.0). The peer check is what finds one slow
device on a busy machine, since outside load slows all ranks alike. `bus` is the
all-reduce bus bandwidth of the node, one figure.

Absolute checks keep the best round: outside load on a shared machine only ever slows a
round, while a slow device is slow in every round, so the best round is the device's
figure. Peer checks keep the median of paired-round ratios.

    samples = {0: {"gemm": [0.09, 0.09, 0.08]}, 1: {"gemm": [0.045, 0.04, 0.05]}}
    results = probe_checks(samples, expect, HealthConfig())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from argosy.health.config import HealthConfig
from argosy.health.expectations import Expectations
from argosy.health.verdict import (
    CheckResult,
    Verdict,
    failed,
    judge,
    not_applicable,
    peer_factors,
)

Samples = Mapping[int, Mapping[str, Sequence[float]]]
"""rank -> probe name -> throughput of each round."""

UNITS = {"gemm": "TFLOP/s", "memory": "GB/s", "host_copy": "GB/s", "bus": "GB/s"}
PEER_UNIT = "x peers"


def probe_checks(
    samples: Samples, expect: Expectations | None, config: HealthConfig, errors: Mapping[int, str]
) -> list[CheckResult]:
    """Every check of the probes, in a stable order (per probe, then per rank)."""
    ranks = sorted({*samples, *errors})
    results: list[CheckResult] = []
    for probe in ("gemm", "memory", "host_copy"):
        wanted = _expected(probe, expect)
        if probe == "host_copy" and not _host_copy_applies(samples, expect):
            results.append(not_applicable(probe, UNITS[probe], "no accelerator: nothing to copy"))
            continue
        results += [
            _absolute(f"{probe}.rank{r}", probe, samples, r, wanted, errors, config) for r in ranks
        ]
        results += _peer_checks(probe, samples, ranks, config)
    results.append(_bus_check(samples, ranks, expect, errors, config))
    return results


def _host_copy_applies(samples: Samples, expect: Expectations | None) -> bool:
    """Accelerators have a host link to measure; a CPU node (or no measurement) does not."""
    if expect is not None:
        return expect.host_copy_gbps is not None
    return any("host_copy" in got for got in samples.values())


def _expected(probe: str, expect: Expectations | None) -> float | None:
    if expect is None:
        return None
    return {
        "gemm": expect.gemm_tflops,
        "memory": expect.memory_gbps,
        "host_copy": expect.host_copy_gbps,
        "bus": expect.bus_gbps,
    }[probe]


def _absolute(
    name: str,
    probe: str,
    samples: Samples,
    rank: int,
    wanted: float | None,
    errors: Mapping[int, str],
    config: HealthConfig,
) -> CheckResult:
    values = samples.get(rank, {}).get(probe)
    if not values:
        return failed(name, UNITS[probe], errors.get(rank, "no measurement"), wanted)
    value = max(values)
    if wanted is None:
        return CheckResult(
            name,
            value,
            UNITS[probe],
            None,
            Verdict.NOT_APPLICABLE,
            detail="chip not in the catalog: no expectation",
        )
    return judge(
        name,
        value=value,
        expected=wanted,
        unit=UNITS[probe],
        config=config,
        detail=f"best of {len(values)} rounds",
    )


def _peer_checks(
    probe: str, samples: Samples, ranks: Sequence[int], config: HealthConfig
) -> list[CheckResult]:
    measured = [r for r in ranks if samples.get(r, {}).get(probe)]
    if len(measured) < 2:
        return []
    num_rounds = min(len(samples[r][probe]) for r in measured)
    rounds = [[samples[r][probe][i] for r in measured] for i in range(num_rounds)]
    return [
        judge(
            f"{probe}_peer.rank{r}",
            value=factor,
            expected=1.0,
            unit=PEER_UNIT,
            config=config,
            detail=f"vs peers, {num_rounds} paired rounds",
        )
        for r, factor in zip(measured, peer_factors(rounds), strict=True)
    ]


def _bus_check(
    samples: Samples,
    ranks: Sequence[int],
    expect: Expectations | None,
    errors: Mapping[int, str],
    config: HealthConfig,
) -> CheckResult:
    if len(ranks) < 2:
        return not_applicable("bus", UNITS["bus"], "one device: no collective to measure")
    if errors:
        reasons = "; ".join(f"rank {r}: {why}" for r, why in sorted(errors.items()))
        return failed("bus", UNITS["bus"], reasons, _expected("bus", expect))
    # every rank times the same all-reduces; the slowest rank's view is the bus figure
    per_rank = [max(samples[r]["bus"]) for r in ranks]
    value = min(per_rank)
    wanted = _expected("bus", expect)
    if wanted is None:
        return not_applicable("bus", UNITS["bus"], f"measured {value:.4g} GB/s; chip unknown")
    return judge(
        "bus",
        value=value,
        expected=wanted,
        unit=UNITS["bus"],
        config=config,
        detail=f"all-reduce over {len(ranks)} ranks",
    )
