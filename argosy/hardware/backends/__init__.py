"""Accelerator backends: the only place in argosy that touches a vendor API.

Each backend module implements `AcceleratorBackend` (see `base`) and is registered here
by dotted path, so no vendor SDK (or torch) is imported until a backend is used.
"""

from argosy.hardware.backends.base import AcceleratorBackend, Device
from argosy.plugins.registry import Registry

__all__ = ["AcceleratorBackend", "Device", "backends"]

backends: Registry[type[AcceleratorBackend]] = Registry("accelerator backend")
backends.register("cuda", "argosy.hardware.backends.cuda:CudaBackend", aliases=("nvidia",))
backends.register("rocm", "argosy.hardware.backends.rocm:RocmBackend", aliases=("amd", "hip"))
backends.register("npu", "argosy.hardware.backends.npu:NpuBackend", aliases=("ascend",))
backends.register("xpu", "argosy.hardware.backends.xpu:XpuBackend", aliases=("intel",))
backends.register("cpu", "argosy.hardware.backends.cpu:CpuBackend", aliases=("host",))
