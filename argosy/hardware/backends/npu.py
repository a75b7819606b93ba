"""Huawei Ascend NPUs through torch_npu (the CANN plug-in for torch)."""

from __future__ import annotations

import glob
import importlib.util

from argosy.hardware.backends.base import Device
from argosy.hardware.catalog import default_catalog


class NpuBackend:
    """Ascend NPUs; detection looks for the davinci device files and the torch_npu package."""

    name = "npu"

    def detect(self) -> bool:
        has_devices = bool(glob.glob("/dev/davinci[0-9]*"))
        return has_devices and importlib.util.find_spec("torch_npu") is not None

    def inventory(self) -> list[Device]:
        import torch
        import torch_npu  # noqa: F401  # registers torch.npu

        catalog = default_catalog()
        devices = []
        for index in range(torch.npu.device_count()):  # type: ignore[attr-defined]  # added by torch_npu
            name = torch.npu.get_device_name(index)  # type: ignore[attr-defined]  # added by torch_npu
            props = torch.npu.get_device_properties(index)  # type: ignore[attr-defined]  # added by torch_npu
            chip = catalog.match_device(name, vendor="huawei")
            devices.append(
                Device(
                    backend=self.name,
                    index=index,
                    name=name,
                    memory_gib=round(props.total_memory / 2**30, 1),
                    catalog_id=chip.id if chip else None,
                )
            )
        return devices
