"""The trainer's side of a save, planned once and reused while the state keeps its tensors.

    planner = SavePlanner(inline_limit=1 << 16)
    planned = planner.plan(flat)          # flat: layout.flatten(state)[0]
    planned.entries, planned.sources, planned.inline_bytes(), planned.signature

A training loop saves the same tensors every time (parameters and optimizer state,
changed in place), so what `save` works out from them, the entries at their offsets, which
tensors travel inline and which are shared with the persister, and the sources'
signature, is the same from one save to the next. For a state of a thousand tensors
that work took ~6 ms a save, all of it inside the loop's stall. `plan` reuses the last
plan when every leaf is what it was: the same keys in the same order, a non-tensor where
there was one, and where there was a tensor the very same tensor object with the same
storage address, dtype, shape and strides (a `.data` swap, `set_` or `resize_` changes one
of them, and the state is planned afresh). DTensors are planned afresh every save (their
local shard is a new tensor object each time). The bytes of inline tensors are read at
every save (`inline_bytes`): they are the tensors' current values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from argosy.checkpoint.layout import TensorEntry, data_len, plan
from argosy.checkpoint.staging import inline_bytes_of, share_sources

_Leaf = tuple[torch.Tensor, int, torch.dtype, torch.Size, tuple[int, ...]] | None
"""What a leaf was: a tensor with its address, dtype, shape and strides; None for an object."""


@dataclass
class Planned:
    """One plan of a save: entries, local tensors, object keys, and what the persister reads."""

    entries: list[TensorEntry]
    tensors: list[torch.Tensor]
    object_keys: list[str]
    data_len: int
    on_device: bool
    sources: list[torch.Tensor | None]
    """CPU states: per tensor, the shared tensor the persister reads, None when inline."""
    signature: list[Any]
    """The sources' addresses and geometry: the persister is sent them again only when
    this changed."""
    keys: list[str] = field(default_factory=list)
    leaves: list[_Leaf] = field(default_factory=list)

    def inline_bytes(self) -> dict[int, bytes]:
        """The current bytes of the tensors that travel inline (CPU states)."""
        return inline_bytes_of(self.tensors, self.sources)

    def still_fits(self, flat: dict[str, Any]) -> bool:
        """Whether `flat` has exactly the leaves this plan was made from (module doc)."""
        if len(flat) != len(self.keys) or list(flat) != self.keys:
            return False
        for value, leaf in zip(flat.values(), self.leaves, strict=True):
            if leaf is None:
                if isinstance(value, torch.Tensor):
                    return False
                continue
            tensor, address, dtype, shape, strides = leaf
            if (
                value is not tensor
                or value.data_ptr() != address
                or value.dtype != dtype
                or value.shape != shape
                or value.stride() != strides
            ):
                return False
        return True


class SavePlanner:
    """Plans a save, or hands back the last plan when the state still fits it."""

    def __init__(self, inline_limit: int) -> None:
        self.inline_limit = inline_limit
        self.last: Planned | None = None
        self.replans = 0
        """How many times the state was planned afresh (tests and diagnostics)."""

    def plan(self, flat: dict[str, Any]) -> Planned:
        if self.last is not None and self.last.still_fits(flat):
            return self.last
        self.replans += 1
        planned = _plan_afresh(flat, self.inline_limit)
        self.last = planned if planned.leaves else None
        return planned


def _plan_afresh(flat: dict[str, Any], inline_limit: int) -> Planned:
    entries, tensors, object_keys = plan(flat)
    on_device = any(t.device.type != "cpu" for t in tensors)
    sources: list[torch.Tensor | None] = []
    if not on_device:
        sources = share_sources(tensors, inline_limit)
    planned = Planned(
        entries,
        tensors,
        object_keys,
        data_len(entries),
        on_device,
        sources,
        source_signature(sources),
    )
    if all(_reusable(v) for v in flat.values()):
        planned.keys = list(flat)
        planned.leaves = [_leaf(v) for v in flat.values()]
    return planned


def source_signature(sources: list[Any]) -> list[Any]:
    """Each source's storage address, dtype, shape and strides (None stays None)."""
    return [
        None if s is None else (s.data_ptr(), s.dtype, tuple(s.shape), tuple(s.stride()))
        for s in sources
    ]


def _reusable(value: Any) -> bool:
    """Plain tensors and objects can be recognised at the next save; DTensors cannot."""
    return not isinstance(value, torch.Tensor) or type(value) in (torch.Tensor, torch.nn.Parameter)


def _leaf(value: Any) -> _Leaf:
    if not isinstance(value, torch.Tensor):
        return None
    return (value, value.data_ptr(), value.dtype, value.shape, value.stride())
