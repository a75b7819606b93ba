"""Page-lock (pin) host memory that already exists, such as a shared-memory tensor.

`tensor.pin_memory()` copies into a fresh pinned allocation, which cannot be shared with
another process; registering the existing pages keeps them shared and makes device-to-host
copies run at full link speed. Without an accelerator both calls do nothing.
"""

from __future__ import annotations

import torch


def pin_shared(tensor: torch.Tensor) -> bool:
    """Register `tensor`'s pages with the CUDA driver; True when they are now pinned."""
    if not torch.cuda.is_available() or tensor.numel() == 0:
        return False
    storage = tensor.untyped_storage()
    err = torch.cuda.cudart().cudaHostRegister(storage.data_ptr(), storage.nbytes(), 0)
    return int(err) == 0


def unpin(tensor: torch.Tensor) -> None:
    if torch.cuda.is_available() and tensor.numel():
        torch.cuda.cudart().cudaHostUnregister(tensor.untyped_storage().data_ptr())
