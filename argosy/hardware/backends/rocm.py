"""AMD GPUs through the ROCm build of torch (torch.cuda with torch.version.hip set)."""

from __future__ import annotations

from pathlib import Path

from argosy.hardware.backends.base import Device
from argosy.hardware.catalog import default_catalog


class RocmBackend:
    """AMD Instinct GPUs; detection looks for the amdgpu kernel driver's KFD node."""

    name = "rocm"

    def detect(self) -> bool:
        return Path("/dev/kfd").exists()

    def inventory(self) -> list[Device]:
        import torch

        if torch.version.hip is None or not torch.cuda.is_available():
            return []
        catalog = default_catalog()
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            chip = catalog.match_device(props.name, vendor="amd")
            devices.append(
                Device(
                    backend=self.name,
                    index=index,
                    name=props.name,
                    memory_gib=round(props.total_memory / 2**30, 1),
                    catalog_id=chip.id if chip else None,
                    details={"arch": getattr(props, "gcnArchName", "")},
                )
            )
        return devices
