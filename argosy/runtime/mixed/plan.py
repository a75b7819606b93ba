"""Plan -> rank assignments: what each rank of a mixed-chip launch does. Pure.

Reads the JSON `argosy plan --json` prints (the whole result, whose first plan is
taken, or one entry of its `plans`), checks it against the launch (device count, chip
types) and assigns ranks to the plan's chip groups in the plan's order: group 0 gets
ranks 0..n0-1, group 1 the next n1, and so on.

- A batch split (`split: batch`, or a homogeneous plan) gives every group its
  `batch_share` of the global batch (at least one sequence per rank: a group the planner
  gave fewer sequences than devices takes the rest from the group with the most per
  device); inside a group the share is divided as evenly as integers allow over its
  ranks, each rank takes whole micro-batches of the group's `mbs`, and the gradient
  average is weighted by samples (`weighting`).
- A layer split (`split: layers`) makes each group a run of pipeline stages holding its
  `layers`; the stage index and layer count reach the script, every rank sees the whole
  global batch.

Knows nothing of torch or processes: tests and the launcher call it alike.

    layout = parse_plan(json.loads(Path("plan.json").read_text()))
    ranks = assign_ranks(layout, world_size=3, emulated=parse_chip_counts("h100:1,a100-80g:2"))
    ranks[1].group, ranks[1].samples, ranks[1].micro_batches
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from argosy.core.errors import ArgosyError

ENV_MIXED = "ARGOSY_MIXED"
"""Environment variable holding the path of the launch's rank assignments (JSON)."""


class PlanMismatchError(ArgosyError):
    """The plan does not fit the launch (device count or chip types)."""


@dataclass(frozen=True)
class GroupLayout:
    """One chip group of a plan, as the plan states it."""

    chip: str
    devices: int
    samples: int
    """Sequences per step this group takes (its batch share)."""
    micro_batch: int
    """Sequences per micro-batch (the group's `mbs`)."""
    stages: int
    """Pipeline stages in this group (layer split) or the group's own `pp`."""
    layers: int | None
    """Layers this group holds (layer split); None when it holds the whole model."""
    predicted_step_s: float
    """The planner's step time for this group on its real chips."""


@dataclass(frozen=True)
class MixedLayout:
    """A whole plan: its groups, global batch and the planner's prediction."""

    split: str
    groups: tuple[GroupLayout, ...]
    global_batch: int
    predicted_step_s: float

    @property
    def devices(self) -> int:
        return sum(g.devices for g in self.groups)

    @property
    def predicted_samples_per_s(self) -> float:
        return self.global_batch / self.predicted_step_s

    def chip_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for g in self.groups:
            counts[g.chip] = counts.get(g.chip, 0) + g.devices
        return counts


@dataclass(frozen=True)
class RankAssignment:
    """What one rank does in a mixed launch."""

    rank: int
    chip: str
    group: int
    group_rank: int
    group_size: int
    samples: int
    """Sequences this rank computes per step (its data-parallel share)."""
    sample_offset: int
    """Where this rank's sequences start inside the step's global batch."""
    micro_batches: int
    micro_batch: int
    stage: int
    num_stages: int
    layers: int | None
    global_batch: int

    @property
    def weight(self) -> float:
        """This rank's share of the gradient average: samples / global batch."""
        return self.samples / self.global_batch


def parse_plan(data: dict[str, Any]) -> MixedLayout:
    """The layout of `argosy plan --json` output (its first plan) or of one plan entry."""
    if "plans" in data:
        if not data["plans"]:
            raise ArgosyError("plan file field 'plans' is empty: the planner found no plan")
        entry, batch = data["plans"][0], data.get("global_batch")
        cluster = str(data.get("cluster", ""))
    else:
        entry, batch, cluster = data, data.get("global_batch"), str(data.get("cluster", ""))
    for key in ("parallel", "predicted"):
        if key not in entry:
            raise ArgosyError(f"plan file: field '{key}' missing; expected `argosy plan --json`")
    if not isinstance(batch, int) or batch < 1:
        raise ArgosyError("plan file: field 'global_batch' missing or not a positive integer")
    step_s = float(entry["predicted"]["step_time_s"])
    split = entry.get("split", "batch")
    if "groups" in entry:
        groups = tuple(_group(g, i, batch, step_s) for i, g in enumerate(entry["groups"]))
    else:
        groups = (_homogeneous(entry, cluster, batch, step_s),)
    if split != "layers":
        groups = _one_sample_per_rank(groups, batch)
    return MixedLayout(split, groups, batch, step_s)


def _one_sample_per_rank(groups: tuple[GroupLayout, ...], batch: int) -> tuple[GroupLayout, ...]:
    """Every rank of a batch split runs as one data-parallel replica, so it needs at least
    one sequence. The planner may give a group fewer sequences than devices (its own
    layout, e.g. pp=2 on 2 devices, needs one); such a group takes the missing sequences,
    one at a time, from the group with the most sequences per device (the rebalancer's
    floor of one sample per rank, applied before the first step)."""
    devices = sum(g.devices for g in groups)
    if batch < devices:
        raise PlanMismatchError(
            f"global batch {batch} cannot give each of the {devices} ranks a sequence; "
            f"plan with --global-batch {devices} or more"
        )
    shares = [g.samples for g in groups]
    for i, g in enumerate(groups):
        while shares[i] < g.devices:
            donors = [j for j, h in enumerate(groups) if shares[j] > h.devices]
            donor = max(donors, key=lambda j: shares[j] / groups[j].devices)
            shares[donor] -= 1
            shares[i] += 1
    return tuple(replace(g, samples=s) for g, s in zip(groups, shares, strict=True))


def _group(g: dict[str, Any], index: int, batch: int, step_s: float) -> GroupLayout:
    where = f"plan file: plans[0].groups[{index}]"
    try:
        chip, devices, parallel = str(g["chip"]), int(g["devices"]), g["parallel"]
    except KeyError as err:
        raise ArgosyError(f"{where}: field {err} missing") from err
    layers = g.get("layers")
    return GroupLayout(
        chip=chip,
        devices=devices,
        samples=int(g.get("batch_share", batch)),
        micro_batch=int(parallel.get("mbs", 1)),
        stages=int(g.get("stages", parallel.get("pp", 1))),
        layers=layers if isinstance(layers, int) else None,
        predicted_step_s=float(g.get("step_time_s", step_s)),
    )


def _homogeneous(entry: dict[str, Any], cluster: str, batch: int, step_s: float) -> GroupLayout:
    """A one-chip plan: the cluster shorthand ('h100-sxm:8') names the chip and count."""
    p = entry["parallel"]
    chip, _, count = cluster.partition(":")
    if not chip or not count.isdigit():
        raise ArgosyError(f"plan file: field 'cluster' is '{cluster}'; expected CHIP:COUNT")
    devices = int(count)
    return GroupLayout(
        chip, devices, batch, int(p.get("mbs", 1)), int(p.get("pp", 1)), None, step_s
    )


def parse_chip_counts(spec: str) -> list[tuple[str, int]]:
    """'h100:1,a100-80g:2' -> [('h100', 1), ('a100-80g', 2)]; names are not resolved here."""
    out: list[tuple[str, int]] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, count = part.partition(":")
        if not name or not count.isdigit() or int(count) < 1:
            raise ArgosyError(f"--emulate-chips '{part}': expected CHIP:N with N >= 1")
        out.append((name.strip(), int(count)))
    if not out:
        raise ArgosyError("--emulate-chips is empty; expected CHIP:N,...")
    return out


def check_launch(
    plan_chips: dict[str, int], world_size: int, launch_chips: dict[str, int], source: str
) -> None:
    """Raise `PlanMismatchError` naming what differs between the plan and the launch.

    Both maps are {canonical chip name: devices}; `launch_chips` is emulated or found."""
    devices = sum(plan_chips.values())
    if devices != world_size:
        raise PlanMismatchError(
            f"plan {source} needs {devices} devices ({_render(plan_chips)}); "
            f"this launch has {world_size} ranks"
        )
    if plan_chips != launch_chips:
        missing = {c: n for c, n in plan_chips.items() if launch_chips.get(c) != n}
        raise PlanMismatchError(
            f"plan {source} is for {_render(plan_chips)}; this launch has "
            f"{_render(launch_chips)} (differs in {', '.join(sorted(missing))})"
        )


def _render(counts: dict[str, int]) -> str:
    return "+".join(f"{chip}:{n}" for chip, n in counts.items())


def assign_ranks(layout: MixedLayout) -> list[RankAssignment]:
    """One assignment per rank, groups in plan order; see the module docstring."""
    out: list[RankAssignment] = []
    offset = 0
    for index, g in enumerate(layout.groups):
        per_rank = _even_split(g.samples, g.devices) if layout.split != "layers" else None
        for local in range(g.devices):
            samples = per_rank[local] if per_rank is not None else layout.global_batch
            stage = local if layout.split == "layers" else 0
            out.append(
                RankAssignment(
                    rank=len(out),
                    chip=g.chip,
                    group=index,
                    group_rank=local,
                    group_size=g.devices,
                    samples=samples,
                    sample_offset=offset if per_rank is not None else 0,
                    micro_batches=-(-samples // g.micro_batch) if samples else 0,
                    micro_batch=g.micro_batch,
                    stage=_global_stage(layout, index) + stage if layout.split == "layers" else 0,
                    num_stages=sum(x.devices for x in layout.groups)
                    if layout.split == "layers"
                    else 1,
                    layers=_stage_layers(g, local) if g.layers is not None else None,
                    global_batch=layout.global_batch,
                )
            )
            if per_rank is not None:
                offset += samples
    return out


def _even_split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _global_stage(layout: MixedLayout, group: int) -> int:
    return sum(g.devices for g in layout.groups[:group])


def _stage_layers(g: GroupLayout, local: int) -> int:
    assert g.layers is not None
    return _even_split(g.layers, g.devices)[local]


def encode_assignments(layout: MixedLayout, ranks: list[RankAssignment], extra: dict) -> str:
    """The JSON the launcher writes for the ranks (`ENV_MIXED` points at it)."""
    return json.dumps(
        {"layout": asdict(layout), "ranks": [asdict(r) for r in ranks], **extra}, indent=1
    )


def layout_from_doc(layout: dict[str, Any], shares: list[int] | None = None) -> MixedLayout:
    """The layout an assignment document records, with each group's batch share replaced
    by `shares` when given (a rebalance keeps the global batch: they must sum to it)."""
    groups = [GroupLayout(**g) for g in layout["groups"]]
    if shares is not None:
        if len(shares) != len(groups) or sum(shares) != layout["global_batch"]:
            raise ValueError(
                f"shares {shares} do not split global batch {layout['global_batch']} "
                f"over {len(groups)} groups"
            )
        groups = [replace(g, samples=int(s)) for g, s in zip(groups, shares, strict=True)]
    return MixedLayout(
        layout["split"], tuple(groups), layout["global_batch"], layout["predicted_step_s"]
    )


def decode_assignment(text: str, rank: int) -> tuple[RankAssignment, dict[str, Any]]:
    """This rank's assignment and the whole document (layout, emulation, ...)."""
    doc = json.loads(text)
    return RankAssignment(**doc["ranks"][rank]), doc
