"""Where a served model computes and in which dtype: `--device` and `--dtype`, resolved.

Pure functions over what the host has, with no torch import, so the HTTP process (which
never imports torch) and the worker resolve the same answer:

- device: `auto` (the first visible CUDA device when there is one, else `cpu`), `cpu`,
  `cuda` (`cuda:0`) or `cuda:N` (N below the number of visible devices);
- dtype: `auto` (float32 on CPU; on a GPU the checkpoint's own 16-bit dtype, bfloat16 for
  a float32 checkpoint, float16 on a GPU without bfloat16), `bfloat16`, `float16` or
  `float32` (`bf16`, `fp16`, `half`, `fp32` read as those).

Bad forms raise `PlacementError` (an `ArgosyError`: the CLI exits 2) listing the accepted
ones. `visible_cuda_count` and `device_key` read NVML and `CUDA_VISIBLE_DEVICES`, never the
CUDA runtime, so the share ledger is keyed by the physical device without a CUDA context.

    placement = resolve("auto", "auto", cuda_count=1, checkpoint="float32")
    placement.device, placement.dtype          # ('cuda:0', 'bfloat16')
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from argosy.core.device_spec import parse_device_spec
from argosy.core.errors import ArgosyError
from argosy.core.visibility import entries

AUTO = "auto"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
_ACCELERATOR_DEFAULT = "bfloat16"


class PlacementError(ArgosyError):
    """A device or dtype that is malformed or not on this host."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Placement:
    """A resolved device (`cpu` or `cuda:N`) and dtype name."""

    device: str
    dtype: str

    @property
    def is_cuda(self) -> bool:
        """The model runs on a CUDA device."""
        return self.device.startswith("cuda")

    @property
    def index(self) -> int:
        """The CUDA device index (0 on CPU)."""
        return int(self.device.partition(":")[2] or 0) if self.is_cuda else 0

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one weight or KV element."""
        return DTYPE_BYTES[self.dtype]

    def torch_dtype(self) -> Any:
        """The `torch.dtype` (imports torch)."""
        import torch

        return getattr(torch, self.dtype)

    def as_dict(self) -> dict[str, str]:
        """JSON-ready fields."""
        return {"device": self.device, "dtype": self.dtype}


def parse_device(spec: str) -> str:
    """`spec` in canonical form (`auto`, `cpu` or `cuda:N`; `cuda` is `cuda:0` for a
    server), else a `PlacementError`."""
    try:
        kind, index = parse_device_spec(spec)
    except ValueError as err:
        raise PlacementError("device", f"unknown {err}") from None
    return f"cuda:{index or 0}" if kind == "cuda" else kind


def parse_dtype(spec: str) -> str:
    """`spec` as `auto` or a dtype name, else a `PlacementError` listing the known ones."""
    text = spec.strip().lower()
    text = _DTYPE_ALIASES.get(text, text)
    if text == AUTO or text in DTYPE_BYTES:
        return text
    known = ", ".join([AUTO, *DTYPE_BYTES])
    raise PlacementError("dtype", f"unknown dtype '{spec}': use {known}")


def resolve_device(spec: str, cuda_count: int) -> str:
    """`cpu` or `cuda:N` for `spec` on a host with `cuda_count` visible CUDA devices."""
    device = parse_device(spec)
    if device == AUTO:
        return "cuda:0" if cuda_count > 0 else "cpu"
    if device == "cpu":
        return device
    index = int(device.partition(":")[2])
    if index >= cuda_count:
        seen = f"{cuda_count} visible" if cuda_count else "none visible"
        raise PlacementError(
            "device", f"device '{spec}' is not on this host (CUDA devices: {seen}); use auto or cpu"
        )
    return device


def resolve_dtype(
    spec: str, device: str, checkpoint: str | None, bf16_supported: bool = True
) -> str:
    """The dtype the weights are held in on `device` (see the module docstring)."""
    dtype = parse_dtype(spec)
    if dtype != AUTO:
        if dtype == "bfloat16" and device != "cpu" and not bf16_supported:
            raise PlacementError("dtype", f"{device} has no bfloat16: use float16 or float32")
        return dtype
    if device == "cpu":
        return "float32"
    if checkpoint in ("bfloat16", "float16") and (checkpoint != "bfloat16" or bf16_supported):
        return checkpoint
    return _ACCELERATOR_DEFAULT if bf16_supported else "float16"


def resolve(
    device: str,
    dtype: str,
    cuda_count: int,
    checkpoint: str | None = None,
    bf16_supported: bool = True,
) -> Placement:
    """Device and dtype together."""
    where = resolve_device(device, cuda_count)
    return Placement(where, resolve_dtype(dtype, where, checkpoint, bf16_supported))


def checkpoint_dtype(path: Any) -> str | None:
    """The dtype an HF checkpoint's config.json declares (`dtype` or `torch_dtype`)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("dtype") or config.get("torch_dtype")
    return value if value in DTYPE_BYTES else None


# -- the host, without a CUDA context --------------------------------------------------------
def visible_cuda_count() -> int:
    """CUDA devices this process would see: NVML's count, narrowed by CUDA_VISIBLE_DEVICES
    (0 without the NVIDIA driver or nvidia-ml-py)."""
    physical = _nvml_count()
    visible = _visible_entries()
    if visible is None:
        return physical
    return min(len(visible), physical)


def device_key(device: str) -> str:
    """The share-ledger name of a resolved device: `cpu`, or `cuda-<physical id>` with the
    id `CUDA_VISIBLE_DEVICES` maps index N to, so services that see different subsets of
    the GPUs still share one ledger per physical device."""
    if not device.startswith("cuda"):
        return "cpu"
    index = int(device.partition(":")[2] or 0)
    visible = _visible_entries()
    physical = visible[index] if visible is not None and index < len(visible) else str(index)
    return f"cuda-{physical}"


def _visible_entries() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list (None when unset); CUDA stops at the first bad entry."""
    return entries(os.environ.get("CUDA_VISIBLE_DEVICES"))


def _nvml_count() -> int:
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
