"""Save and restore through the flash checkpointer, with fallback to older checkpoints.

    ckpt = open_checkpointer(directory, keep=3)
    step, state = restore(ckpt, say=print)      # (0, None) when there is nothing usable

`open_checkpointer` returns `argosy.checkpoint.FlashCheckpointer` (memory first, then
disk). Only where that package is absent does it fall back to `DiskCheckpointer`, a plain
torch.save-to-temp-then-rename store, so the runtime stays usable on its own.

`restore` asks for the newest complete checkpoint; if it cannot be read it walks back to
older steps, and under torch.distributed the ranks agree on the newest step that *every*
rank can load, so no rank resumes from a different step than its peers. Whatever it
falls back to, it says so through `say`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

Say = Callable[[str], None]


class Checkpointer(Protocol):
    """The agreed flash checkpointer API (argosy.checkpoint)."""

    def save(self, step: int, state: dict[str, Any]) -> None: ...
    def before_optimizer_step(self) -> None: ...
    def load(self, step: int | None = None) -> tuple[int, dict[str, Any]] | None: ...
    def latest_step(self) -> int | None: ...
    def wait(self) -> int | None: ...
    def close(self) -> None: ...


def open_checkpointer(
    directory: Path | str,
    keep: int = 3,
    kind: str = "auto",
    progress: Callable[[str, int], None] | None = None,
) -> Checkpointer:
    """The flash checkpointer when installed (kind auto or flash), else the disk fallback.

    `progress(phase, bytes)` is handed to the flash checkpointer (hooks.checkpoint_progress).
    """
    if kind not in ("auto", "flash", "disk"):
        raise ValueError(f"checkpointer kind '{kind}'; expected auto, flash or disk")
    try:
        from argosy.checkpoint import FlashCheckpointer
    except ImportError:
        if kind == "flash":
            raise
        return DiskCheckpointer(directory, keep=keep)
    if kind == "disk":
        return DiskCheckpointer(directory, keep=keep)
    return FlashCheckpointer(directory, keep=keep, progress=progress)


def restore(ckpt: Checkpointer, say: Say = print) -> tuple[int, dict[str, Any] | None]:
    """The newest checkpoint all ranks can load, as (step, state); (0, None) for none."""
    if not isinstance(ckpt, DiskCheckpointer):
        return _load_collective(ckpt, say)
    step, state = _load_local(ckpt, None, say)
    while True:
        agreed = _agree_min(step)
        if agreed == step:
            return step, state
        say(f"another rank cannot load step {step}; falling back to step {agreed}")
        step, state = _load_local(ckpt, agreed, say)


def _load_collective(ckpt: Checkpointer, say: Say) -> tuple[int, dict[str, Any] | None]:
    """FlashCheckpointer.load agrees on a step across ranks and skips torn ones itself."""
    try:
        got = ckpt.load()
    except Exception as err:  # nothing loadable must not stop the restart
        say(f"no usable checkpoint ({err}); starting from step 0")
        return 0, None
    return (0, None) if got is None else (got[0], got[1])


def _load_local(ckpt: Checkpointer, at_most: int | None, say: Say) -> tuple[int, Any]:
    """Newest checkpoint this rank can load, no newer than `at_most` when given."""
    if at_most == 0:
        return 0, None
    failed = False
    for want in _candidates(ckpt, at_most):
        try:
            got = ckpt.load() if want is None else ckpt.load(want)
        except Exception as err:  # a corrupt checkpoint must not stop the restart
            label = want if want is not None else ckpt.latest_step()
            say(f"checkpoint of step {label} is unreadable ({err}); trying an older one")
            failed = True
            continue
        if got is None and want is None:
            break  # nothing complete was ever saved
        if got is not None and (at_most is None or got[0] <= at_most):
            return got[0], got[1]
    if failed or at_most:
        say("no usable checkpoint; starting from step 0")
    return 0, None


def _candidates(ckpt: Checkpointer, at_most: int | None) -> Iterable[int | None]:
    """The newest first (`None` = whatever the checkpointer calls newest), then older steps."""
    yield at_most
    top = at_most if at_most is not None else ckpt.latest_step()
    if top is None:
        return
    steps = getattr(ckpt, "steps", None)
    older = sorted(steps(), reverse=True) if callable(steps) else range(top - 1, 0, -1)
    yield from (s for s in older if s < top)


def _agree_min(step: int) -> int:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return step
    value = torch.tensor([step], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


class DiskCheckpointer:
    """Fallback when argosy.checkpoint is absent: synchronous torch.save per rank.

    Layout: `<directory>/step-<N>/rank-<R>.pt`, written to a temp name and renamed, so a
    crash mid-write leaves no file that reads as a checkpoint.
    """

    def __init__(self, directory: Path | str, keep: int = 3) -> None:
        self.directory = Path(directory)
        self.keep = keep
        self.rank = int(os.environ.get("RANK", "0"))

    def _path(self, step: int) -> Path:
        return self.directory / f"step-{step}" / f"rank-{self.rank}.pt"

    def steps(self) -> list[int]:
        found = []
        for d in self.directory.glob("step-*"):
            match = re.fullmatch(r"step-(\d+)", d.name)
            if match and (d / f"rank-{self.rank}.pt").exists():
                found.append(int(match.group(1)))
        return sorted(found)

    def save(self, step: int, state: dict[str, Any]) -> None:
        import torch

        path = self._path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        for old in self.steps()[: -self.keep]:
            self._path(old).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # another rank's file is still there
                self._path(old).parent.rmdir()

    def before_optimizer_step(self) -> None:
        """Saves are synchronous here, so there is nothing to fence."""

    def load(self, step: int | None = None) -> tuple[int, dict[str, Any]] | None:
        import torch

        steps = self.steps()
        if step is None:
            step = steps[-1] if steps else None
        if step is None or step not in steps:
            return None
        return step, torch.load(self._path(step), weights_only=False)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def wait(self) -> int | None:
        """Nothing is in flight: the newest saved step is already on disk."""
        return self.latest_step()

    def close(self) -> None:
        """Nothing to release."""
