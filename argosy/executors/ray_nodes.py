"""What a Ray node offers the scheduler, and what argosy calls it.

`chip_offer(entry, match)` reads one entry of `ray.nodes()`: a custom `chip:<catalog id>`
resource first, else Ray's own `GPU` with the catalog chip that `match` finds for its
`accelerator_type:<X>` (`catalog_chip`: `H100` is `h100-sxm`, `A100-80G` is `a100-80g`);
None for a node with neither. `node_names(offers, given)` gives each offer its name: the
`argosy.io/node` label; else the name it was given before (`given`: Ray node id -> name),
so a node's name never changes while its raylet lives; else its IP when no other node
holds or takes that IP; else `<ip>-<first 8 hex of its node id>`.
Pure functions over Ray's node table; no Ray import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from argosy.hardware.catalog import default_catalog

CHIP_PREFIX = "chip:"
GPU = "GPU"
ACCELERATOR_PREFIX = "accelerator_type:"
NODE_LABEL = "argosy.io/node"
"""The Ray node label that names a node (stable across raylet restarts)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChipOffer:
    """What one alive Ray node offers: `devices` chips of one type, asked for in a
    placement bundle as the Ray resource `resource`."""

    node_id: str
    address: str
    label: str
    """Its `argosy.io/node` label, or ""."""
    chip: str
    devices: int
    resource: str


def chip_offer(node: dict[str, Any], match: Callable[[str], str | None]) -> ChipOffer | None:
    """The chips of one entry of `ray.nodes()`: a `chip:<id>` resource first, else Ray's
    `GPU` with the catalog chip `match` finds for its `accelerator_type:<X>`; None when it
    has neither."""
    resources: dict[str, float] = node.get("Resources") or {}
    label = (node.get("Labels") or {}).get(NODE_LABEL, "")
    base = (node["NodeID"], node.get("NodeManagerAddress", ""), label)
    chips = sorted(
        r
        for r, amount in resources.items()
        if r.startswith(CHIP_PREFIX) and "_group_" not in r and amount >= 1
    )  # `chip:x_group_<id>` is Ray's name for what a placement group reserved
    if chips:
        if len(chips) > 1:
            log.debug("ray node %s has several chip resources; using %s", base[0][:8], chips[0])
        return ChipOffer(
            *base, chips[0].removeprefix(CHIP_PREFIX), int(resources[chips[0]]), chips[0]
        )
    kinds = sorted(
        r.removeprefix(ACCELERATOR_PREFIX) for r in resources if r.startswith(ACCELERATOR_PREFIX)
    )
    if resources.get(GPU, 0) < 1 or not kinds:
        return None
    chip = match(kinds[0])
    return None if chip is None else ChipOffer(*base, chip, int(resources[GPU]), GPU)


def node_names(offers: list[ChipOffer], given: dict[str, str] | None = None) -> list[str]:
    """The name of each offer: its label; else its name in `given` (Ray node id -> the
    name an earlier call gave it) while no other offer claims that name; else its IP
    when no other unlabelled offer without a name has it and no one holds it; else
    `<ip>-<first 8 hex of its Ray node id>`. A live node is never renamed when another
    joins (the server books devices by name): an unlabelled second raylet on one IP takes
    the long name, and a raylet that restarts (a new node id) takes its IP back when free."""
    given = given or {}
    names: list[str | None] = [o.label or None for o in offers]
    held = {n for n in names if n}
    for k, o in enumerate(offers):
        old = given.get(o.node_id)
        if names[k] is None and old is not None and old not in held:
            names[k] = old
            held.add(old)
    fresh: dict[str, int] = {}
    for k, o in enumerate(offers):
        if names[k] is None:
            fresh[o.address] = fresh.get(o.address, 0) + 1
    for k, o in enumerate(offers):
        if names[k] is None:
            alone = fresh[o.address] == 1 and o.address not in held
            names[k] = o.address if alone else f"{o.address}-{o.node_id[:8]}"
            held.add(names[k])
    return [n or "" for n in names]


def catalog_chip(accelerator_type: str) -> str | None:
    """The catalog id of a chip Ray names by `accelerator_type` (`H100`, `A100-80G`): a
    catalog name or alias, else the chip whose driver-name pattern fits (`-80G` read as
    `80GB`), else None."""
    catalog = default_catalog()
    if accelerator_type in catalog:
        return catalog.canonical(accelerator_type)
    reported = accelerator_type + "B" if accelerator_type.endswith("G") else accelerator_type
    chip = catalog.match_device(reported)
    return None if chip is None else chip.id
