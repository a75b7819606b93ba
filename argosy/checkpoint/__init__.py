"""Flash checkpoint: shared-memory snapshots, an async persister, DCP on disk.

Importing this package is light; torch loads when a checkpointer is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from argosy.checkpoint.flash import CheckpointError, FlashCheckpointer
    from argosy.checkpoint.restore import CheckpointMismatchError

__all__ = ["CheckpointError", "CheckpointMismatchError", "FlashCheckpointer"]


def __getattr__(name: str) -> Any:
    if name in ("FlashCheckpointer", "CheckpointError"):
        from argosy.checkpoint import flash

        return getattr(flash, name)
    if name == "CheckpointMismatchError":
        from argosy.checkpoint.restore import CheckpointMismatchError

        return CheckpointMismatchError
    raise AttributeError(name)
