"""A batch loop over a (tiny) Hugging Face causal LM, shared by the serving batching tests."""

from __future__ import annotations

from typing import Any

import torch
import transformers

from argosy.serving.batching import BatchLoop


def batch_loop(model: Any, max_batch_size: int = 8, **kwargs: Any) -> BatchLoop:
    """`BatchLoop` running `model` with a DynamicCache built from per-layer tensors."""

    def batched(ids, cache, mask, positions, num_logits):
        with torch.inference_mode():
            out = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                logits_to_keep=num_logits,
            )
            return out.logits

    def make_cache(layers):
        return transformers.DynamicCache(ddp_cache_data=layers)

    return BatchLoop(batched, make_cache, max_batch_size, **kwargs)
