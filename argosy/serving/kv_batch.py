"""Batched KV caches: several requests' caches as one left-padded cache and its mask.

A `KVRows` is a Hugging Face cache of B rows ([B, heads, width, dim] per layer), the
attention mask over its positions ([B, width], on the host: 1 = a real position, 0 =
padding or a hole) and each row's count of real positions. Row i's real positions are
its tokens in order, ending at the right edge; holes (masked positions between them, from
rejected drafts or a batched prefill's right-aligned inputs) are like padding.

Every operation here costs a few tensor operations per layer whatever the number of rows:
on a GPU a decode step is launch-bound, and work per row and layer (thousands of small
copies at 64 rows) would cost more than the step itself.

    rows = stack([cache_a, cache_b], make_cache)      # two requests' own caches
    rows = merge(rows, newcomers, make_cache)         # more rows join
    rows = compact(rows, make_cache)                  # holes squeezed out
    own = row_cache(rows, 0, make_cache)              # one request's own cache again
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

MakeCache = Callable[[list[tuple[torch.Tensor, torch.Tensor]]], Any]
"""Builds a cache object from per-layer (keys, values)."""


@dataclass
class KVRows:
    """B requests' positions in one cache (see the module docstring)."""

    cache: Any
    mask: torch.Tensor
    lengths: list[int]

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])


def stack(caches: Sequence[Any], make_cache: MakeCache) -> KVRows:
    """Requests' own (unpadded) caches as rows; a single cache is used as it is."""
    lengths = [int(cache.get_seq_length()) for cache in caches]
    mask = ones_right(lengths, max(lengths))
    if len(caches) == 1:
        return KVRows(caches[0], mask, lengths)
    return KVRows(stack_seeded(caches, lengths, make_cache), mask, lengths)


def stack_seeded(caches: Sequence[Any], lengths: Sequence[int], make_cache: MakeCache) -> Any:
    """Caches of `lengths` positions each (0: an empty cache, no layers yet), left-padded
    into one cache of B rows; an empty cache when every one is empty."""
    width = max(lengths)
    if width == 0:
        return make_cache([])
    reference = next(c for c, n in zip(caches, lengths, strict=True) if n).layers
    layers = []
    for index, ref in enumerate(reference):
        keys, values = [], []
        for cache, length in zip(caches, lengths, strict=True):
            if length:
                keys.append(left_pad(cache.layers[index].keys, width))
                values.append(left_pad(cache.layers[index].values, width))
            else:
                keys.append(ref.keys.new_zeros(1, ref.keys.shape[1], width, ref.keys.shape[3]))
                values.append(
                    ref.values.new_zeros(1, ref.values.shape[1], width, ref.values.shape[3])
                )
        layers.append((torch.cat(keys), torch.cat(values)))
    return make_cache(layers)


def merge(old: KVRows, new: KVRows, make_cache: MakeCache) -> KVRows:
    """`old`'s rows then `new`'s, left-padded to the wider: one concatenation per layer."""
    width = max(old.width, new.width)
    layers = []
    for a, b in zip(old.cache.layers, new.cache.layers, strict=True):
        keys = torch.cat([left_pad(a.keys, width), left_pad(b.keys, width)])
        values = torch.cat([left_pad(a.values, width), left_pad(b.values, width)])
        layers.append((keys, values))
    mask = torch.cat([left_pad_mask(old.mask, width), left_pad_mask(new.mask, width)])
    return KVRows(make_cache(layers), mask, [*old.lengths, *new.lengths])


def select(rows: KVRows, keep: Sequence[int]) -> KVRows:
    """The rows at `keep` (in that order; an index may repeat), in place of the others."""
    if list(keep) == list(range(len(rows.lengths))):
        return rows
    device = rows.cache.layers[0].keys.device if rows.cache.layers else "cpu"
    rows.cache.batch_select_indices(torch.tensor(list(keep), device=device))
    return KVRows(rows.cache, rows.mask[list(keep)], [rows.lengths[i] for i in keep])


def compact(rows: KVRows, make_cache: MakeCache) -> KVRows:
    """Every row's masked-out positions squeezed out: one gather per layer, rows
    left-padded to the longest again."""
    width = max(rows.lengths)
    index = torch.zeros(len(rows.lengths), width, dtype=torch.long)
    for i, length in enumerate(rows.lengths):
        index[i, width - length :] = rows.mask[i].nonzero().flatten()
    index = index.to(rows.cache.layers[0].keys.device)
    layers = []
    for layer in rows.cache.layers:
        keys, values = layer.keys, layer.values
        gather = index[:, None, :, None].expand(keys.shape[0], keys.shape[1], width, keys.shape[3])
        layers.append((keys.gather(2, gather), values.gather(2, gather)))
    return KVRows(make_cache(layers), ones_right(rows.lengths, width), list(rows.lengths))


def row_layers(rows: KVRows, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Row `row`'s real positions per layer, unpadded: [1, heads, length, dim] each."""
    keep = rows.mask[row].nonzero().flatten().to(rows.cache.layers[0].keys.device)
    return [
        (layer.keys[row : row + 1, :, keep], layer.values[row : row + 1, :, keep])
        for layer in rows.cache.layers
    ]


def row_cache(rows: KVRows, row: int, make_cache: MakeCache) -> Any:
    """Row `row` as a request's own cache again."""
    return make_cache(row_layers(rows, row))


def left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[B, heads, length, dim] -> [B, heads, width, dim], zeros on the left."""
    missing = width - tensor.shape[2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([pad, tensor], dim=2)


def left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    """[B, length] attention mask -> [B, width], zeros (hidden) on the left."""
    missing = width - mask.shape[1]
    if missing == 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], missing), mask], dim=1)


def ones_right(lengths: Sequence[int], width: int) -> torch.Tensor:
    """A [len(lengths), width] attention mask whose row i shows its last `lengths[i]`."""
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, width - length :] = 1
    return mask
