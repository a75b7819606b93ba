"""Model proposers: a small draft model (`draft:PATH`) and early-exit self-drafting (`self`).

Both run a causal LM greedily for up to `max_draft_tokens` tokens and keep its own KV cache
per request. Before drafting, the cache is cropped to the longest prefix it shares with the
request's context (the target may have rejected part of the last draft), and only the new
tokens are fed. Greedy drafts are deterministic, so the engine's verification (argmax, or
accept-with-p(d) for sampling) keeps the output exactly the target's.

- `draft:PATH`: an HF checkpoint directory with the target's tokenizer (for instance the
  trained draft `argosy serve train-draft` writes). Loaded once per path and shared.
- `self[:K]`: the target's own first K layers (default: a fifth of them), final norm and
  LM head, sharing the target's weights (no extra memory): LayerSkip-style early exit.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from argosy.core.errors import ConfigError
from argosy.serving.speculative.base import ProposerContext

_LOADED: dict[str, Any] = {}
_LOAD_LOCK = threading.Lock()


class ModelDraftProposer:
    """Drafts greedily with a (smaller) causal LM that shares the target's tokenizer."""

    def __init__(self, draft_model: Any, max_draft_tokens: int = 4) -> None:
        from transformers import DynamicCache

        self.model = draft_model
        self.max_draft_tokens = max_draft_tokens
        self.cache = DynamicCache()
        self.cached: list[int] = []  # tokens whose keys and values the cache holds

    def propose(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` greedy tokens of the draft model after `context`."""
        limit = min(max_tokens, self.max_draft_tokens)
        if limit <= 0 or not context:
            return []
        tokens = list(context)
        keep = min(_common_prefix(self.cached, tokens), len(tokens) - 1)
        if keep < len(self.cached):
            self.cache.crop(keep - len(self.cached))  # a negative count drops that many
            self.cached = self.cached[:keep]
        draft: list[int] = []
        feed = tokens[keep:]
        with torch.inference_mode():
            while len(draft) < limit:
                ids = torch.tensor([feed], device=self.model.device)
                out = self.model(input_ids=ids, past_key_values=self.cache, logits_to_keep=1)
                self.cached.extend(feed)
                feed = [int(out.logits[0, -1].argmax())]
                draft.append(feed[0])
        return draft


class SelfDraftProposer(ModelDraftProposer):
    """Early exit: the target's first K layers, final norm and LM head as the draft."""

    def __init__(self, max_draft_tokens: int = 4, context: ProposerContext | None = None) -> None:
        if context is None or context.target is None:
            raise ConfigError("speculative 'self' needs an engine that exposes its model")
        layers = int(context.target.config.num_hidden_layers)
        depth = _depth(context.arg, layers)
        super().__init__(early_exit_view(context.target, depth), max_draft_tokens)


class DraftModelProposer(ModelDraftProposer):
    """A separate draft checkpoint, `draft:PATH`."""

    def __init__(self, max_draft_tokens: int = 4, context: ProposerContext | None = None) -> None:
        if context is None or not context.arg:
            raise ConfigError("speculative 'draft' needs a checkpoint: draft:PATH")
        target = context.target
        where = (target.device, target.dtype) if target is not None else None
        super().__init__(load_draft(context.arg, where), max_draft_tokens)


def early_exit_view(model: Any, depth: int) -> Any:
    """A model object running only the first `depth` layers; parameters are shared."""
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner.layers = torch.nn.ModuleList(list(model.model.layers)[:depth])
    inner.config = copy.copy(model.model.config)
    inner.config.num_hidden_layers = depth
    outer = copy.copy(model)
    outer._modules = dict(model._modules)
    outer.model = inner
    outer.config = inner.config
    return outer


def load_draft(path: str, placement: tuple[Any, Any] | None = None) -> Any:
    """Load (once per path and placement) an HF causal LM checkpoint to draft with, on the
    target's (device, dtype) when given (float32 on CPU otherwise)."""
    from transformers import AutoModelForCausalLM

    where = Path(path).expanduser()
    if not (where / "config.json").exists():
        raise ConfigError(f"draft checkpoint not found: {where} has no config.json")
    with _LOAD_LOCK:
        device, dtype = placement if placement is not None else ("cpu", torch.float32)
        key = f"{where.resolve()}|{device}|{dtype}"
        if key not in _LOADED:
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
            _LOADED[key] = model.to(device).eval()
        return _LOADED[key]


def _depth(arg: str | None, layers: int) -> int:
    if arg is None or arg == "":
        return max(1, layers // 5)
    if not arg.isdigit() or not 1 <= int(arg) < layers:
        raise ConfigError(f"speculative 'self:{arg}': the depth must be 1 to {layers - 1}")
    return int(arg)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
