"""Prefix cache: prompts that share leading tokens reuse the KV those tokens computed.

The cache holds KV in blocks of `block_tokens` prompt positions, in a trie keyed by each
block's token ids (exact: no hashes, no collisions). A block stands for its whole path
from the root, since a position's keys and values depend on every token before it.

- `match(tokens)` walks the trie along `tokens` and returns the longest cached
  block-aligned prefix that leaves at least one token to compute (the prompt's last
  position must be fed to get the first token's logits), as per-layer (keys, values)
  tensors [1, kv_heads, positions, head_dim], concatenated: a copy the request owns.
- `insert(tokens, layers)` stores the full blocks of a prefilled prompt's cache (each
  block a copy of its slice).
- Memory is bounded: at most `capacity_tokens // block_tokens` blocks, evicted least
  recently used first; a block is touched leaf to root, so leaves go before the prefixes
  they extend, and evicting a block drops the blocks below it (unreachable without it).
  Its cost is `cached_tokens x kv_bytes_per_token` (budget.kv_bytes_per_token).

Thread-safe (one lock): the batch loop matches and inserts; `clear` (sleep) may come from
another thread. It knows nothing of models: tensors in, tensors out.

    cache = PrefixCache(block_tokens=32, capacity_tokens=8192)
    reused, layers = cache.match(prompt)      # 0, [] on a miss
    ...prefill prompt[reused:] on top of `layers`...
    cache.insert(prompt, [(layer.keys, layer.values) for layer in kv.layers])
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each [1, kv_heads, positions, head_dim]."""


@dataclass
class PrefixCacheStats:
    """Counters since start (a sleep clears the blocks, not the counters)."""

    queries: int = 0
    """Prompts looked up."""
    hits: int = 0
    """Lookups that reused at least one block."""
    reused_tokens: int = 0
    """Prompt positions served from the cache instead of computed."""
    inserted_blocks: int = 0
    evicted_blocks: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain JSON-ready counters."""
        return asdict(self)


@dataclass(eq=False)
class _Block:
    tokens: tuple[int, ...]
    layers: Layers
    parent: _Block | None
    children: dict[tuple[int, ...], _Block] = field(default_factory=dict)


class PrefixCache:
    """Block-granular KV of prompt prefixes, shared across requests, LRU-bounded."""

    def __init__(self, block_tokens: int, capacity_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.block_tokens = block_tokens
        self.capacity_tokens = capacity_tokens
        self.stats = PrefixCacheStats()
        self._roots: dict[tuple[int, ...], _Block] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()  # id -> block, oldest first
        self._lock = threading.Lock()

    @property
    def capacity_blocks(self) -> int:
        """Most blocks held at once."""
        return self.capacity_tokens // self.block_tokens

    @property
    def cached_tokens(self) -> int:
        """Prompt positions held now (what the cache costs, in KV positions)."""
        return len(self._lru) * self.block_tokens

    def match(self, tokens: Sequence[int]) -> tuple[int, Layers]:
        """The longest cached block-aligned prefix of `tokens[:-1]`: (positions, KV)."""
        with self._lock:
            self.stats.queries += 1
            path = self._walk(tokens, (len(tokens) - 1) // self.block_tokens)
            if not path:
                return 0, []
            self._touch(path)
            self.stats.hits += 1
            reused = len(path) * self.block_tokens
            self.stats.reused_tokens += reused
        return reused, _concat([block.layers for block in path])

    def insert(self, tokens: Sequence[int], layers: Layers) -> None:
        """Store the full blocks of `tokens` from `layers` (positions 0.. of the cache)."""
        size = self.block_tokens
        held = int(layers[0][0].shape[2]) if layers else 0
        num_blocks = min(len(tokens), held) // size
        if num_blocks == 0 or self.capacity_blocks == 0:
            return
        with self._lock:
            path: list[_Block] = []
            children, parent = self._roots, None
            for b in range(num_blocks):
                key = tuple(tokens[b * size : (b + 1) * size])
                block = children.get(key)
                if block is None:
                    block = _Block(key, _slice(layers, b * size, (b + 1) * size), parent)
                    children[key] = block
                    self.stats.inserted_blocks += 1
                path.append(block)
                children, parent = block.children, block
            self._touch(path)
            self._evict()

    def clear(self) -> None:
        """Drop every block (sleep): the memory goes with the last request holding none."""
        with self._lock:
            self._roots.clear()
            self._lru.clear()

    # -- internals -----------------------------------------------------------------------
    def _walk(self, tokens: Sequence[int], num_blocks: int) -> list[_Block]:
        path: list[_Block] = []
        children = self._roots
        for b in range(num_blocks):
            block = children.get(tuple(tokens[b * self.block_tokens : (b + 1) * self.block_tokens]))
            if block is None:
                break
            path.append(block)
            children = block.children
        return path

    def _touch(self, path: list[_Block]) -> None:
        """Most recent: the root of the path; least: its leaf (evicted first)."""
        for block in reversed(path):
            self._lru[id(block)] = block
            self._lru.move_to_end(id(block))

    def _evict(self) -> None:
        while len(self._lru) > self.capacity_blocks:
            _, block = self._lru.popitem(last=False)
            siblings = block.parent.children if block.parent is not None else self._roots
            siblings.pop(block.tokens, None)
            self.stats.evicted_blocks += 1 + self._drop_below(block)

    def _drop_below(self, block: _Block) -> int:
        dropped = 0
        stack = list(block.children.values())
        while stack:
            child = stack.pop()
            if self._lru.pop(id(child), None) is not None:
                dropped += 1
            stack.extend(child.children.values())
        return dropped


def _slice(layers: Layers, start: int, end: int) -> Layers:
    return [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in layers]


def _concat(blocks: list[Layers]) -> Layers:
    num_layers = len(blocks[0])
    return [
        (
            torch.cat([b[i][0] for b in blocks], dim=2),
            torch.cat([b[i][1] for b in blocks], dim=2),
        )
        for i in range(num_layers)
    ]
