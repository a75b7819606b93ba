"""The launcher's side of `argosy launch --plan`: check the plan, write rank assignments.

    env = prepare(Path("plan.json"), "h100:1,a100-80g:2", world_size=3, run_dir=Path("runs/x"))
    spec.extra_env.update(env)        # every rank finds its assignment through ARGOSY_MIXED

A plan whose device count or chip types differ from the launch raises
`PlanMismatchError` (exit 2) naming the difference. Without `--emulate-chips` the launch's
chips are the host's (device discovery: the first accelerator type found, else the CPU),
one per rank. With it, ranks take the plan's chip identities and an emulated speed
(`emulate`: relative speeds, reference time given or left to calibration; knobs
`ARGOSY_EMULATE_SPEED`, `ARGOSY_EMULATE_SAMPLE_S`, `ARGOSY_EMULATE_HEADROOM`);
`<run dir>/mixed/assignment.json` records both, and the rebalance policy (batch shares
that follow measured speeds, `rebalance`; off with `argosy launch --no-rebalance`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.hardware.catalog import default_catalog
from argosy.runtime.mixed.emulate import (
    ENV_EMULATE,
    HEADROOM,
    SPEED_SOURCES,
    canonical_counts,
    parse_sample_seconds,
    relative_speeds,
)
from argosy.runtime.mixed.plan import (
    ENV_MIXED,
    MixedLayout,
    RankAssignment,
    assign_ranks,
    check_launch,
    encode_assignments,
    parse_chip_counts,
    parse_plan,
)
from argosy.runtime.mixed.rebalance import RebalancePolicy

ASSIGNMENT_FILE = "mixed/assignment.json"
ENV_HEADROOM = "ARGOSY_EMULATE_HEADROOM"
"""Overrides the calibration's headroom (`emulate.HEADROOM`) for one launch."""
ENV_SAMPLE_S = "ARGOSY_EMULATE_SAMPLE_S"
"""CHIP=SECONDS,...: emulated seconds per sample per chip, given instead of calibrated
(so that several launches share one time scale)."""
ENV_SPEED = "ARGOSY_EMULATE_SPEED"
"""Where relative chip speeds come from: peak (catalog bf16 peak, default) or plan."""
EMULATION_NOTE = (
    "EMULATED chips: every rank computes on the host CPU; each micro-batch is set to last "
    "samples x the chip's emulated seconds per sample (real compute, then sleep to that "
    "deadline); speeds from SOURCE, reference time REFERENCE"
)


def prepare(
    plan_path: Path,
    emulate: str | None,
    world_size: int,
    run_dir: Path,
    rebalance: RebalancePolicy | None = None,
) -> dict[str, str]:
    """Validate the plan against the launch, write the assignments; the ranks' env.

    `rebalance` (default: on, `RebalancePolicy()`) is recorded for the ranks; it acts on
    batch splits over several chip groups only (`rank.MixedRank.policy`)."""
    layout = parse_plan(_read_plan(plan_path))
    catalog = default_catalog()
    if emulate:
        launch_chips = canonical_counts(parse_chip_counts(emulate), catalog)
    else:
        launch_chips = {_host_chip(): world_size}
    plan_chips = canonical_counts(list(layout.chip_counts().items()), catalog)
    check_launch(plan_chips, world_size, launch_chips, str(plan_path))
    ranks = assign_ranks(layout)
    extra = {
        "plan": str(plan_path),
        "emulation": _emulation(layout, ranks, emulate, catalog),
        "rebalance": (rebalance or RebalancePolicy()).model_dump(),
    }
    path = run_dir / ASSIGNMENT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(encode_assignments(layout, ranks, extra))
    env = {ENV_MIXED: str(path.resolve())}
    if emulate:
        env[ENV_EMULATE] = emulate
    return env


def _read_plan(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ArgosyError(f"--plan {path}: no such file") from err
    except json.JSONDecodeError as err:
        raise ArgosyError(f"--plan {path}:{err.lineno}: not JSON ({err.msg})") from err


def _host_chip() -> str:
    from argosy.hardware.discovery import discover

    devices = discover()
    return devices[0].catalog_id or devices[0].backend if devices else "cpu"


def _emulation(
    layout: MixedLayout, ranks: list[RankAssignment], emulate: str | None, catalog: Any
) -> dict | None:
    if not emulate:
        return None
    chips = [catalog.canonical(r.chip) for r in ranks]
    peaks = relative_speeds([(chip, 1) for chip in chips], catalog)
    source = os.environ.get(ENV_SPEED, "peak")
    if source not in SPEED_SOURCES:
        raise ArgosyError(f"{ENV_SPEED}={source!r}: expected one of {', '.join(SPEED_SOURCES)}")
    speeds = [s.relative_speed for s in peaks] if source == "peak" else _plan_speeds(layout, ranks)
    given = _given_sample_s(chips, catalog)
    headroom = _headroom()
    reference = f"calibrated at start-up x headroom {headroom:g}"
    if given:  # the given times are the speeds too
        source, reference = "given", "given (ARGOSY_EMULATE_SAMPLE_S)"
        speeds = [min(given.values()) / given[chip] for chip in chips]
    return {
        "spec": emulate,
        "chips": [s.chip for s in peaks],
        "peak_tflops": [s.peak_tflops for s in peaks],
        "speed_source": source,
        "relative_speed": speeds,
        "headroom": headroom,
        "sample_s": given,
        "note": EMULATION_NOTE.replace("SOURCE", _SOURCE_TEXT[source]).replace(
            "REFERENCE", reference
        ),
    }


_SOURCE_TEXT = {
    "peak": "catalog dense bf16 peaks",
    "plan": "the planner's per-device rates",
    "given": "the given per-chip times",
}


def _plan_speeds(layout: MixedLayout, ranks: list[RankAssignment]) -> list[float]:
    """Per rank: its group's planned samples/s per device over the fastest group's."""
    if layout.split != "batch" or any(g.predicted_step_s <= 0 for g in layout.groups):
        raise ArgosyError(f"{ENV_SPEED}=plan needs a batch-split plan with per-group step times")
    rates = [g.samples / g.predicted_step_s / g.devices for g in layout.groups]
    return [rates[r.group] / max(rates) for r in ranks]


def _given_sample_s(chips: list[str], catalog: Any) -> dict[str, float] | None:
    """`ARGOSY_EMULATE_SAMPLE_S` as {canonical chip: seconds}; every chip must be named."""
    text = os.environ.get(ENV_SAMPLE_S)
    if not text:
        return None
    try:
        given = {catalog.canonical(c): s for c, s in parse_sample_seconds(text).items()}
    except ValueError as err:
        raise ArgosyError(f"{ENV_SAMPLE_S}: {err}") from err
    missing = sorted(set(chips) - set(given))
    if missing:
        raise ArgosyError(f"{ENV_SAMPLE_S}={text!r} names no time for {', '.join(missing)}")
    return {chip: given[chip] for chip in chips}


def _headroom() -> float:
    """`ARGOSY_EMULATE_HEADROOM` (>= 1) when set, else `emulate.HEADROOM`."""
    text = os.environ.get(ENV_HEADROOM)
    if text is None:
        return HEADROOM
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value < 1.0:
        raise ArgosyError(f"{ENV_HEADROOM}={text!r}: expected a number >= 1")
    return value
