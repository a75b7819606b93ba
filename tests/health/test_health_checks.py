"""From probe samples to checks and the report: pure, synthetic samples, no processes."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.hardware.catalog import default_catalog
from argosy.health.checks import probe_checks
from argosy.health.config import HealthConfig
from argosy.health.expectations import expectations
from argosy.health.report import HealthReport, NodeInfo
from argosy.health.verdict import Verdict, classify

CONFIG = HealthConfig()
CPU = expectations(default_catalog().get("cpu"), CONFIG)
H100 = expectations(default_catalog().get("h100"), CONFIG)
NODE = NodeInfo("cpu", "cpu", 2, "gloo", CPU.basis)


def samples_of(speeds: list[float], expect=CPU, rounds: int = 5, host: bool = False) -> dict:
    """Samples of ranks running at `speeds` x the expectation, with a little round noise."""
    noise = [1.0, 0.97, 1.03, 0.99, 1.01][:rounds]
    probes = {"gemm": expect.gemm_tflops, "memory": expect.memory_gbps, "bus": expect.bus_gbps}
    if host:
        probes["host_copy"] = expect.host_copy_gbps
    return {
        r: {p: [want * speed * n for n in noise] for p, want in probes.items()}
        for r, speed in enumerate(speeds)
    }


def by_name(results) -> dict:
    return {r.name: r for r in results}


def test_a_healthy_cpu_node() -> None:
    got = by_name(probe_checks(samples_of([1.0, 1.0]), CPU, CONFIG, {}))
    assert got["host_copy"].verdict is Verdict.NOT_APPLICABLE
    assert {r.verdict for n, r in got.items() if n != "host_copy"} == {Verdict.HEALTHY}
    assert got["gemm.rank0"].expected == CPU.gemm_tflops
    assert got["gemm_peer.rank1"].factor == pytest.approx(1.0)


def test_a_half_speed_rank_is_degraded_with_its_factor() -> None:
    got = by_name(probe_checks(samples_of([1.0, 0.5, 1.0]), CPU, CONFIG, {}))
    for name in ("gemm_peer.rank1", "memory_peer.rank1", "gemm.rank1"):
        assert got[name].verdict is Verdict.DEGRADED
        assert got[name].factor == pytest.approx(0.5, abs=0.02)
    assert got["gemm_peer.rank0"].verdict is Verdict.HEALTHY


def test_accelerator_node_judges_host_copy_against_the_floor() -> None:
    got = by_name(probe_checks(samples_of([1.0, 0.1], H100, host=True), H100, CONFIG, {}))
    assert got["host_copy.rank0"].expected == CONFIG.host_copy_gbps
    assert got["host_copy.rank1"].verdict is Verdict.FAILED
    assert H100.gemm_tflops == pytest.approx(989 * CONFIG.gemm_fraction)


def test_a_rank_that_died_fails_its_checks_and_the_bus() -> None:
    samples = samples_of([1.0, 1.0])
    del samples[1]
    got = by_name(probe_checks(samples, CPU, CONFIG, {1: "RuntimeError: device lost"}))
    assert got["gemm.rank1"].verdict is Verdict.FAILED
    assert "device lost" in got["gemm.rank1"].detail
    assert got["bus"].verdict is Verdict.FAILED
    assert "gemm_peer.rank0" not in got  # no peers left to compare with


def test_one_device_has_no_peers_and_no_bus() -> None:
    got = by_name(probe_checks(samples_of([1.0]), CPU, CONFIG, {}))
    assert got["bus"].verdict is Verdict.NOT_APPLICABLE
    assert not [n for n in got if "_peer" in n]


def test_unknown_chip_measures_without_judging() -> None:
    got = by_name(probe_checks(samples_of([1.0, 0.5]), None, CONFIG, {}))
    assert got["gemm.rank0"].verdict is Verdict.NOT_APPLICABLE and got["gemm.rank0"].value
    assert got["gemm_peer.rank1"].verdict is Verdict.DEGRADED  # peers need no catalog
    assert got["host_copy"].verdict is Verdict.NOT_APPLICABLE  # nothing measured it


@pytest.mark.parametrize(
    ("speeds", "want_code"), [([1.0, 1.0], 0), ([1.0, 0.5], 1)], ids=["healthy", "slow"]
)
def test_report_json_contract_and_exit_code(speeds: list[float], want_code: int) -> None:
    report = HealthReport(tuple(probe_checks(samples_of(speeds), CPU, CONFIG, {})), NODE, 1.0)
    data = json.loads(json.dumps(report.to_json()))
    assert data["verdict"] in {"healthy", "degraded", "failed"}
    for check in data["checks"]:
        assert {"name", "value", "unit", "expected", "verdict"} <= set(check)
    assert report.exit_code == want_code
    assert (data["verdict"] == "healthy") == (want_code == 0)
    slow = data["slow_devices"]
    assert slow == [] if want_code == 0 else slow[0]["rank"] == 1


@pytest.mark.slow
@pytest.mark.integration
def test_ranks_that_cannot_start_fail_with_their_reason(tmp_path) -> None:
    from argosy.health.harness import spawn_ranks
    from argosy.health.worker import ProbePlan

    plan = ProbePlan(
        "cpu",
        "no-such-backend",
        2,
        str(tmp_path / "store"),
        3,
        0.01,
        64,
        "float32",
        1 << 20,
        1 << 20,
    )
    samples, errors = spawn_ranks(plan, timeout_s=60)
    assert samples == {} and sorted(errors) == [0, 1]
    assert all("no-such-backend" in why for why in errors.values()), errors
    got = by_name(probe_checks(samples, CPU, CONFIG, errors))
    assert got["gemm.rank0"].verdict is Verdict.FAILED and got["bus"].verdict is Verdict.FAILED


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({"slow": {1: 2.0}}, "throttle factor"),
        ({"slow": {-1: 0.5}}, "beyond the node"),
        ({"slow": {9: 0.5}}, "beyond the node"),
        ({"ranks": 0}, "at least 1"),
    ],
    ids=["factor-above-one", "negative-rank", "rank-beyond", "zero-ranks"],
)
def test_run_check_refuses_bad_input_before_starting_ranks(kwargs: dict, want: str) -> None:
    from argosy.core.errors import ConfigError
    from argosy.health.harness import run_check

    with pytest.raises(ConfigError, match=want):
        run_check(CONFIG, **kwargs)


def test_config_thresholds_must_be_ordered_and_known() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="must be below degraded_below"):
        HealthConfig(failed_below=0.9, degraded_below=0.8)
    with pytest.raises(ValidationError, match="extra"):
        HealthConfig(degraded_bellow=0.7)


@given(
    speeds=st.lists(st.floats(0.01, 2.0), min_size=1, max_size=6),
    dead=st.sets(st.integers(0, 5), max_size=2),
)
def test_every_rank_gets_judged_and_the_node_is_its_worst_check(
    speeds: list[float], dead: set[int]
) -> None:
    """Invariants: one absolute check per rank and probe, peer checks for the ranks that
    measured (when two or more did), verdicts follow the factors, the node is the worst."""
    samples = samples_of(speeds)
    errors = {r: "lost" for r in dead if r < len(speeds)}
    for rank in errors:
        del samples[rank]
    results = probe_checks(samples, CPU, CONFIG, errors)
    got = by_name(results)
    for probe in ("gemm", "memory"):
        assert {n for n in got if n.startswith(f"{probe}.rank")} == {
            f"{probe}.rank{r}" for r in range(len(speeds))
        }
        peers = {n for n in got if n.startswith(f"{probe}_peer.")}
        assert peers == ({f"{probe}_peer.rank{r}" for r in samples} if len(samples) > 1 else set())
    for check in results:
        if check.factor is not None and check.value is not None:
            assert check.verdict is classify(check.factor, CONFIG)
        if check.name.split(".")[-1] in {f"rank{r}" for r in errors}:
            assert check.verdict is Verdict.FAILED
    report = HealthReport(tuple(results), NODE, 1.0)
    assert report.verdict.severity == max(r.verdict.severity for r in results)
    assert report.exit_code == (0 if report.verdict is Verdict.HEALTHY else 1)
