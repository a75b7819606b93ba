"""The host CPU as a device: what local gloo runs train on."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from argosy.hardware.backends.base import Device


class CpuBackend:
    """Always present: reports one device for the host, with its cores and memory."""

    name = "cpu"

    def detect(self) -> bool:
        return True

    def inventory(self) -> list[Device]:
        model = _cpu_model() or platform.processor() or platform.machine()
        return [
            Device(
                backend=self.name,
                index=0,
                name=model,
                memory_gib=round(_memory_bytes() / 2**30, 1),
                catalog_id="cpu",
                details={"cores": str(os.cpu_count() or 1), "arch": platform.machine()},
            )
        ]


def _cpu_model() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return None
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
