"""Intel accelerators through torch.xpu (Intel GPUs; Gaudi exposes itself as 'hpu')."""

from __future__ import annotations

import glob
import importlib.util

from argosy.hardware.backends.base import Device
from argosy.hardware.catalog import default_catalog


class XpuBackend:
    """Intel devices; detection looks for Gaudi's accel nodes or a DRM render node with
    Intel's PyTorch extension installed."""

    name = "xpu"

    def detect(self) -> bool:
        if glob.glob("/dev/accel/accel[0-9]*"):
            return True
        has_render = bool(glob.glob("/dev/dri/renderD*"))
        return has_render and importlib.util.find_spec("intel_extension_for_pytorch") is not None

    def inventory(self) -> list[Device]:
        import torch

        xpu = getattr(torch, "xpu", None)
        if xpu is None or not xpu.is_available():
            return []
        catalog = default_catalog()
        devices = []
        for index in range(xpu.device_count()):
            props = xpu.get_device_properties(index)
            chip = catalog.match_device(props.name, vendor="intel")
            devices.append(
                Device(
                    backend=self.name,
                    index=index,
                    name=props.name,
                    memory_gib=round(props.total_memory / 2**30, 1),
                    catalog_id=chip.id if chip else None,
                )
            )
        return devices
