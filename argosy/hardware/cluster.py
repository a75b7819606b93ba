"""The cluster model: node groups of one chip type each, wired into a topology tree.

A cluster is what the planner, scheduler and simulator agree they are talking about:

    device -> node -> domain (NVLink / HCCS / Infinity Fabric) -> leaf -> spine [-> ...]

`ClusterSpec` is the validated user description (YAML or shorthand); `Cluster` is the
resolved model with catalog chips and numbered nodes. Groups never share a leaf switch:
traffic between chip types crosses the top of the tree, and is priced on the slowest
link it crosses.

    cluster = load_cluster("a100-80g:512+910b:512")
    cluster.num_devices          # 1024
    cluster.groups[1].chip.id    # "910b"
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from argosy.hardware.catalog import Catalog, Chip, default_catalog

LevelName = Literal["leaf", "spine", "superspine", "pod"]
KNOWN_LEVELS: tuple[str, ...] = ("leaf", "spine", "superspine", "pod")


class LevelSpec(BaseModel):
    """One switch level above the scale-up domain."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: LevelName
    """Level name; one of leaf, spine, superspine, pod."""
    fanout: int = Field(default=32, ge=1)
    """Children per switch at this level (domains under a leaf, leaves under a spine, ...)."""


def _default_levels() -> tuple[LevelSpec, ...]:
    return (LevelSpec(name="leaf", fanout=32), LevelSpec(name="spine", fanout=16))


class TopologySpec(BaseModel):
    """Switch levels above the scale-up domain, lowest first."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    levels: tuple[LevelSpec, ...] = Field(default_factory=_default_levels)
    """Levels from the leaf switch upwards; names must not repeat."""

    @model_validator(mode="after")
    def _distinct(self) -> TopologySpec:
        names = [level.name for level in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"topology levels repeat: {names}")
        return self


class NodeGroupSpec(BaseModel):
    """Devices of one chip type; unset fields take the catalog's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    chip: str
    """Catalog name or alias of the chip."""
    count: int = Field(gt=0)
    """Number of devices in the group."""
    name: str | None = None
    """Group name; defaults to the chip's canonical name."""
    devices_per_node: int | None = Field(default=None, gt=0)
    """Devices per node; default min(8, the chip's scale-up domain size)."""
    domain_size: int | None = Field(default=None, gt=0)
    """Devices per scale-up domain (e.g. 72 for NVL72); default from the catalog."""
    nic_gbps: float | None = Field(default=None, gt=0)
    """Scale-out Gb/s per device; default from the catalog."""


class ClusterSpec(BaseModel):
    """A cluster as the user describes it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = "cluster"
    """Free-form name shown in reports."""
    groups: tuple[NodeGroupSpec, ...] = Field(min_length=1)
    """Node groups, one chip type each (a chip type may appear in several groups)."""
    topology: TopologySpec = Field(default_factory=TopologySpec)
    """Switch levels above the scale-up domain."""


@dataclass(frozen=True)
class NodeGroup:
    """A resolved node group."""

    index: int
    name: str
    chip: Chip
    num_devices: int
    devices_per_node: int
    domain_size: int
    nic_gbps: float

    @property
    def num_nodes(self) -> int:
        return self.num_devices // self.devices_per_node

    @property
    def nodes_per_domain(self) -> int:
        """Nodes sharing one scale-up domain (1 unless the domain spans nodes, as NVL72)."""
        return max(1, self.domain_size // self.devices_per_node)


@dataclass(frozen=True)
class Node:
    """One node and its place in the tree: `path[i]` is its switch id at level i."""

    index: int
    group: int
    chip: str
    num_devices: int
    domain: int
    path: tuple[int, ...]


@dataclass(frozen=True)
class Cluster:
    """A resolved cluster: groups with catalog chips and a numbered topology tree."""

    name: str
    groups: tuple[NodeGroup, ...]
    levels: tuple[LevelSpec, ...]

    @property
    def num_devices(self) -> int:
        return sum(group.num_devices for group in self.groups)

    @property
    def num_nodes(self) -> int:
        return sum(group.num_nodes for group in self.groups)

    def devices_by_chip(self) -> dict[str, int]:
        """Device count per canonical chip name, in group order."""
        counts: dict[str, int] = {}
        for group in self.groups:
            counts[group.chip.id] = counts.get(group.chip.id, 0) + group.num_devices
        return counts

    @property
    def is_mixed(self) -> bool:
        return len(self.devices_by_chip()) > 1

    @cached_property
    def nodes(self) -> tuple[Node, ...]:
        """Every node, numbered group by group, with its domain and switch ids."""
        return tuple(_lay_out_nodes(self.groups, self.levels))

    def describe(self) -> str:
        """Shorthand form of the groups, e.g. 'a100-80g:512+910b:512'."""
        return "+".join(f"{g.chip.id}:{g.num_devices}" for g in self.groups)


class GroupError(ValueError):
    """A node group that cannot exist; `index` and `field` say which group and key."""

    def __init__(self, index: int, field: str, message: str) -> None:
        self.index = index
        self.field = field
        super().__init__(message)


def resolve(spec: ClusterSpec, catalog: Catalog | None = None) -> Cluster:
    """Resolve a spec against the catalog; raises `GroupError` for an impossible group and
    `UnknownNameError` for a chip the catalog does not know."""
    catalog = catalog or default_catalog()
    groups = tuple(_resolve_group(i, g, catalog) for i, g in enumerate(spec.groups))
    return Cluster(name=spec.name, groups=groups, levels=spec.topology.levels)


def _resolve_group(index: int, spec: NodeGroupSpec, catalog: Catalog) -> NodeGroup:
    chip = catalog.get(spec.chip)
    domain_size = spec.domain_size or chip.link.domain_size
    per_node = spec.devices_per_node or min(8, domain_size, spec.count)
    if spec.count % per_node:
        raise GroupError(
            index, "devices_per_node", f"{per_node} devices per node do not divide {spec.count}"
        )
    if domain_size % per_node and per_node % domain_size:
        raise GroupError(
            index,
            "domain_size",
            f"domain_size={domain_size} and devices_per_node={per_node} must divide one another",
        )
    return NodeGroup(
        index=index,
        name=spec.name or chip.id,
        chip=chip,
        num_devices=spec.count,
        devices_per_node=per_node,
        domain_size=domain_size,
        nic_gbps=spec.nic_gbps or chip.nic_gbps,
    )


def _lay_out_nodes(groups: tuple[NodeGroup, ...], levels: tuple[LevelSpec, ...]) -> list[Node]:
    nodes: list[Node] = []
    domain_base = 0
    switch_base = [0] * len(levels)
    for group in groups:
        num_domains = -(-group.num_nodes // group.nodes_per_domain)
        for local in range(group.num_nodes):
            domain = local // group.nodes_per_domain
            path, unit = [], domain
            for i, level in enumerate(levels):
                unit //= level.fanout
                path.append(switch_base[i] + unit)
            nodes.append(
                Node(
                    index=len(nodes),
                    group=group.index,
                    chip=group.chip.id,
                    num_devices=group.devices_per_node,
                    domain=domain_base + domain,
                    path=tuple(path),
                )
            )
        domain_base += num_domains
        unit = num_domains
        for i, level in enumerate(levels):
            unit = -(-unit // level.fanout)
            switch_base[i] += unit
    return nodes
