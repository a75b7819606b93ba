"""The chip catalog: accelerator specs as data, each with its public source.

The data lives in `chips.yaml` beside this module; this module validates it once and
answers look-ups by name or alias. Unknown names raise `UnknownNameError` with the
known names, closest first.

    catalog = default_catalog()
    catalog.get("h100").bf16_tflops   # 989.0 (h100 is an alias of h100-sxm)
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from argosy.core.documents import load_yaml, validate
from argosy.core.errors import ConfigError, UnknownNameError

CATALOG_PATH = Path(__file__).with_name("chips.yaml")

Vendor = Literal["nvidia", "amd", "huawei", "kunlunxin", "hygon", "intel", "cpu"]
Dtype = Literal["bf16", "fp16", "fp8"]


class Link(BaseModel):
    """The scale-up interconnect inside a node or NVLink/HCCS domain."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: str
    """Link technology, e.g. nvlink4, hccs, infinity-fabric, pcie5."""
    gbps: float = Field(gt=0)
    """Per-device aggregate bandwidth in GB/s (bytes), as vendors quote it."""
    domain_size: int = Field(ge=1)
    """Devices that reach each other over this link (8 in an HGX board, 72 in NVL72)."""


class Chip(BaseModel):
    """One accelerator model's specs."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    id: str = ""
    """Canonical catalog name (filled from the catalog key)."""
    name: str
    """Marketing name with form factor and memory size."""
    vendor: Vendor
    """Who makes it; decides the device-discovery backend."""
    aliases: tuple[str, ...] = ()
    """Other names accepted wherever a chip is named."""
    match: str | None = None
    """Regular expression matched against the name a device driver reports."""
    bf16_tflops: float | None = Field(default=None, gt=0)
    """Dense peak bf16 tensor TFLOPs (no sparsity)."""
    fp16_tflops: float | None = Field(default=None, gt=0)
    """Dense peak fp16 tensor TFLOPs."""
    fp8_tflops: float | None = Field(default=None, gt=0)
    """Dense peak fp8 tensor TFLOPs; null where the chip has no fp8 units."""
    memory_gib: float = Field(gt=0)
    """Device memory in GiB."""
    memory_tbps: float = Field(gt=0)
    """Device memory bandwidth in TB/s."""
    link: Link
    """Scale-up interconnect."""
    nic_gbps: float = Field(gt=0)
    """Typical scale-out network bandwidth per device, Gb/s (bits)."""
    tdp_w: float = Field(gt=0)
    """Board power in watts."""
    confidence: Literal["datasheet", "press"] = "datasheet"
    """Whether the figures come from a datasheet or from announcements and press."""
    source: str
    """Where the figures were read."""

    def peak_tflops(self, dtype: Dtype = "bf16") -> float:
        """Dense peak for `dtype`; raises if the chip has no units for it."""
        value = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp8": self.fp8_tflops}[dtype]
        if value is None:
            raise ConfigError(f"chip '{self.id}' has no {dtype} tensor units")
        return value


class _CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    chips: dict[str, Chip]


class Catalog:
    """Chips by canonical name, with alias resolution."""

    def __init__(self, chips: dict[str, Chip]) -> None:
        self._chips = {key: chip.model_copy(update={"id": key}) for key, chip in chips.items()}
        self._aliases: dict[str, str] = {}
        for key, chip in self._chips.items():
            for alias in chip.aliases:
                if alias in self._chips or alias in self._aliases:
                    raise ConfigError(f"alias '{alias}' of '{key}' is already taken")
                self._aliases[alias] = key

    @classmethod
    def from_file(cls, path: Path) -> Catalog:
        """Load and validate a catalog YAML file."""
        return cls(validate(_CatalogFile, load_yaml(path)).chips)

    def get(self, name: str) -> Chip:
        """The chip called `name` (canonical or alias, case-insensitive)."""
        return self._chips[self.canonical(name)]

    def canonical(self, name: str) -> str:
        """The canonical name of `name`."""
        key = name.strip().lower()
        if key in self._chips:
            return key
        if key in self._aliases:
            return self._aliases[key]
        raise UnknownNameError("chip", name, [*self._chips, *self._aliases])

    def match_device(self, reported_name: str, vendor: str | None = None) -> Chip | None:
        """The catalog chip whose `match` pattern fits a driver-reported device name."""
        for chip in self._chips.values():
            if vendor is not None and chip.vendor != vendor:
                continue
            if chip.match and re.search(chip.match, reported_name):
                return chip
        return None

    def chips(self) -> list[Chip]:
        """Every chip, in catalog order."""
        return list(self._chips.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.strip().lower() in {*self._chips, *self._aliases}


@cache
def default_catalog() -> Catalog:
    """The catalog shipped with argosy (loaded once per process)."""
    return Catalog.from_file(CATALOG_PATH)
