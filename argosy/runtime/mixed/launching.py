"""The launcher's side of `argosy launch --plan`: check the plan, write rank assignments.

    env = prepare(Path("plan.json"), "h100:1,a100-80g:2", world_size=3, run_dir=Path("runs/x"))
    spec.extra_env.update(env)        # every rank finds its assignment through ARGOSY_MIXED

A plan whose device count or chip types differ from the launch raises
`PlanMismatchError` (exit 2) naming the difference. Without `--emulate-chips` the launch's
chips are the host's (device discovery: the first accelerator type found, else the CPU),
one per rank. With it, ranks take the plan's chip identities and a throttle
(`emulate`); `<run dir>/mixed/assignment.json` records both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.hardware.catalog import default_catalog
from argosy.runtime.mixed.emulate import ENV_EMULATE, HEADROOM, canonical_counts, emulated_speeds
from argosy.runtime.mixed.plan import (
    ENV_MIXED,
    RankAssignment,
    assign_ranks,
    check_launch,
    encode_assignments,
    parse_chip_counts,
    parse_plan,
)

ASSIGNMENT_FILE = "mixed/assignment.json"
ENV_HEADROOM = "ARGOSY_EMULATE_HEADROOM"
"""Overrides the emulation's common slowdown (`emulate.HEADROOM`) for one launch."""
EMULATION_NOTE = (
    "EMULATED chips: every rank computes on the host CPU; each micro-batch is stretched by "
    "sleep to its wall time x slowdown, slowdown = HEADROOM x fastest chip's dense bf16 peak / "
    "its chip's (catalog)"
)


def prepare(plan_path: Path, emulate: str | None, world_size: int, run_dir: Path) -> dict[str, str]:
    """Validate the plan against the launch, write the assignments; the ranks' env."""
    layout = parse_plan(_read_plan(plan_path))
    catalog = default_catalog()
    if emulate:
        launch_chips = canonical_counts(parse_chip_counts(emulate), catalog)
    else:
        launch_chips = {_host_chip(): world_size}
    plan_chips = canonical_counts(list(layout.chip_counts().items()), catalog)
    check_launch(plan_chips, world_size, launch_chips, str(plan_path))
    ranks = assign_ranks(layout)
    extra = {"plan": str(plan_path), "emulation": _emulation(ranks, emulate, catalog)}
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


def _emulation(ranks: list[RankAssignment], emulate: str | None, catalog: Any) -> dict | None:
    if not emulate:
        return None
    headroom = _headroom()
    speeds = emulated_speeds([(r.chip, 1) for r in ranks], catalog, headroom)
    return {
        "spec": emulate,
        "chips": [r.chip for r in ranks],
        "peak_tflops": [s.peak_tflops for s in speeds],
        "headroom": headroom,
        "slowdown": [s.slowdown for s in speeds],
        "note": EMULATION_NOTE.replace("HEADROOM", f"{headroom:g}"),
    }


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
