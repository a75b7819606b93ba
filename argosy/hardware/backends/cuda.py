"""NVIDIA GPUs through torch.cuda (NVML via torch): the only module that calls torch.cuda."""

from __future__ import annotations

import glob
import shutil

from argosy.hardware.backends.base import Device
from argosy.hardware.backends.signals import VendorSignal
from argosy.hardware.catalog import default_catalog


class CudaBackend:
    """NVIDIA GPUs; detection looks for the driver's device files before importing torch."""

    name = "cuda"

    def detect(self) -> bool:
        return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None

    def inventory(self) -> list[Device]:
        import torch

        if not torch.cuda.is_available() or torch.version.hip is not None:
            return []
        catalog = default_catalog()
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            chip = catalog.match_device(props.name, vendor="nvidia")
            devices.append(
                Device(
                    backend=self.name,
                    index=index,
                    name=props.name,
                    memory_gib=round(props.total_memory / 2**30, 1),
                    catalog_id=chip.id if chip else None,
                    details={
                        "capability": f"{props.major}.{props.minor}",
                        "sms": str(props.multi_processor_count),
                    },
                )
            )
        return devices

    def health_signals(self, window_s: float = 0.0) -> list[VendorSignal]:
        """ECC, row-remap, slowdown and XID counters through NVML (SupportsHealthSignals)."""
        from argosy.hardware.backends.nvml import read_signals

        return read_signals(window_s=window_s)


# -- one process's use of a device (the serving engines call these) ---------------------------
def visible_count() -> int:
    """CUDA devices torch sees in this process (0 without CUDA or on a ROCm build)."""
    import torch

    if not torch.cuda.is_available() or torch.version.hip is not None:
        return 0
    return int(torch.cuda.device_count())


def use_device(index: int) -> None:
    """Make device `index` this process's current CUDA device."""
    import torch

    torch.cuda.set_device(index)


def start_context(index: int) -> None:
    """Create device `index`'s CUDA context and make it current; nothing else (no
    allocator, no cuBLAS handle, whose settings a script may still choose)."""
    import torch

    torch.cuda.set_device(index)
    torch.cuda.synchronize(index)


def current_device() -> int:
    """The device this process works on, or -1 while it has not started CUDA; torch is
    not imported for the question (a process without it has not started CUDA)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return -1
    return int(torch.cuda.current_device())


def bf16_supported(index: int) -> bool:
    """Whether device `index` computes in bfloat16 natively."""
    import torch

    with torch.cuda.device(index):
        return bool(torch.cuda.is_bf16_supported())


def total_memory(index: int) -> int:
    """Bytes of memory on device `index`."""
    import torch

    return int(torch.cuda.get_device_properties(index).total_memory)


def limit_process_memory(fraction: float, index: int) -> None:
    """Cap this process's caching allocator at `fraction` of device `index`'s memory (a
    service's share under `argosy serve --memory-fraction`): allocations past it fail."""
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction, index)


def release_cached() -> None:
    """Give the caching allocator's free blocks back to the driver (after a sleep)."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
