"""This machine's nodes as the local executor offers them, and whose devices are whose.

Nodes: the accelerators device discovery reports (one node per chip type: `<host>`, or
`<host>-<chip>` when several chip types share the machine; with `node_devices`, nodes of
that many devices each, `<host>-0`, `<host>-1`, ...), or, on a machine without any, CPU
slots (`cpu_nodes`). The scheduler resizes elastic jobs and lends a tidal service's
devices a whole node at a time, so on one 8-GPU host `node_devices: 1` lets an elastic
job grow into and give back single GPUs beside the replicas.

On accelerator nodes each attempt is given device indices (`DeviceBook`) and the vendor's
visible-devices variable naming them (`argosy.core.visibility`), recorded in its attempt
directory (`devices.json`) so a restarted server knows who holds what. CPU slots have no
indices: nothing is narrowed.

    devices = LocalDevices("gpu-host", slots=0, node_devices=0)
    devices.inventory()                       # [NodeInfo("gpu-host", "h100-sxm", 8, ...)]
    env = devices.take("j1", {"gpu-host": 4}, attempt_dir)   # {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from argosy.core.visibility import BACKEND_VARIABLE, narrowed
from argosy.executors.base import NodeInfo
from argosy.executors.device_book import DeviceBook
from argosy.hardware.backends.base import Device

DEVICES_FILE = "devices.json"
"""The file in an attempt's record directory naming the device indices it holds."""


class LocalDevices:
    """Discovery read once, as nodes, and the book of which attempt holds which device."""

    def __init__(
        self,
        host: str,
        slots: int,
        node_devices: int,
        discover: Callable[[], list[Device]] | None = None,
    ) -> None:
        self.host, self.slots, self.node_devices = host, slots, node_devices
        self._discover = discover
        self._found: list[Device] | None = None
        self._book: DeviceBook | None = None
        self._grouped: list[_Group] | None = None

    def inventory(self) -> list[NodeInfo]:
        groups = self._groups()
        if not groups:
            return cpu_nodes(self.host, self.slots or os.cpu_count() or 1, self.node_devices)
        return [NodeInfo(g.name, g.chip, len(g.indices), "127.0.0.1") for g in groups]

    @property
    def book(self) -> DeviceBook:
        if self._book is None:
            self._book = DeviceBook({g.name: list(g.indices) for g in self._groups()})
        return self._book

    def take(self, holder: str, wanted: Mapping[str, int], where: Path) -> dict[str, str]:
        """Give the attempt `holder` its devices (DevicesBusyError where they are not free),
        record them in `where`, and return the environment that narrows it to them."""
        held = self.book.take(holder, wanted)
        (where / DEVICES_FILE).write_text(json.dumps({n: list(v) for n, v in held.items()}))
        return self._environment(held)

    def seen(self, holder: str) -> str:
        """What `holder` sees, as its environment says it (`CUDA_VISIBLE_DEVICES=0,1`);
        "" when it holds no indices."""
        env = self._environment(self.book.held(holder))
        return " ".join(f"{k}={v}" for k, v in sorted(env.items()))

    def busy(self, wanted: Mapping[str, int]) -> bool:
        """Whether a new attempt on `wanted` would find fewer free devices than it asks
        for (an attempt stopped to make room for it still holds them until it is gone)."""
        return any(k > len(self.book.free(n)) for n, k in wanted.items() if n in self.book.devices)

    def adopt(self, holder: str, where: Path) -> None:
        """A running attempt a restarted server adopts keeps the devices it recorded."""
        try:
            held = json.loads((where / DEVICES_FILE).read_text())
        except (OSError, ValueError):
            return  # started before devices were recorded, or on CPU slots
        if isinstance(held, dict):
            valid = {
                n: [i for i in v if isinstance(i, int)]
                for n, v in held.items()
                if isinstance(v, list)
            }
            self.book.restore(holder, valid)

    def _environment(self, held: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
        backend_of = {g.name: g.backend for g in self._groups()}
        by_variable: dict[str, list[int]] = {}
        for node, indices in held.items():
            variable = BACKEND_VARIABLE.get(backend_of.get(node, ""))
            if variable is not None:
                by_variable.setdefault(variable, []).extend(indices)
        return {v: narrowed(v, sorted(ix), os.environ) for v, ix in by_variable.items()}

    def _accelerators(self) -> list[Device]:
        if self._found is None:
            from argosy.hardware.discovery import discover

            found = (self._discover or discover)()
            self._found = [d for d in found if d.catalog_id and d.backend != "cpu"]
        return self._found

    def _groups(self) -> list[_Group]:
        """The accelerators as nodes: one per chip type (`<host>`, or `<host>-<chip>`
        beside another type), each split into nodes of `node_devices` (`...-0`, `...-1`)."""
        if self._grouped is None:
            by_chip: dict[str, list[Device]] = {}
            for d in sorted(self._accelerators(), key=lambda d: d.index):
                by_chip.setdefault(str(d.catalog_id), []).append(d)
            self._grouped = []
            for chip, devices in by_chip.items():
                base = self.host if len(by_chip) == 1 else f"{self.host}-{chip}"
                parts = _chunks(devices, self.node_devices)
                for i, part in enumerate(parts):
                    name = base if len(parts) == 1 else f"{base}-{i}"
                    indices = tuple(d.index for d in part)
                    self._grouped.append(_Group(name, chip, part[0].backend, indices))
        return self._grouped


@dataclass(frozen=True)
class _Group:
    """One node of this machine's accelerators: its devices' indices and backend."""

    name: str
    chip: str
    backend: str
    indices: tuple[int, ...]


def _chunks(devices: list[Device], size: int) -> list[list[Device]]:
    if size <= 0 or size >= len(devices):
        return [devices]
    return [devices[i : i + size] for i in range(0, len(devices), size)]


def cpu_nodes(host: str, slots: int, node_devices: int) -> list[NodeInfo]:
    """This machine's CPU slots as one node, or as nodes of `node_devices` slots each."""
    if node_devices <= 0 or node_devices >= slots:
        return [NodeInfo(name=host, chip="cpu", devices=slots, address="127.0.0.1")]
    sizes = [node_devices] * (slots // node_devices) + [slots % node_devices] * bool(
        slots % node_devices
    )
    return [NodeInfo(f"{host}-{i}", "cpu", n, "127.0.0.1") for i, n in enumerate(sizes)]
