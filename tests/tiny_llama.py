"""A batch loop and a single-sequence decoder over a (tiny) Hugging Face causal LM, shared by
the serving batching tests."""

from __future__ import annotations

from typing import Any

import torch
import transformers

from argosy.serving.batching import BatchLoop
from argosy.serving.decoding import Decoder
from argosy.serving.speculative import PROPOSERS
from argosy.serving.types import SamplingParams


def tiny_llama(vocab_size: int, initializer_range: float = 0.02) -> Any:
    """A 2-layer, 32-wide random Llama (seed 0) in eval mode; a larger `initializer_range`
    gives sharper attention."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=initializer_range,
    )
    return transformers.LlamaForCausalLM(config).eval()


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


def causal_lm_forward(model: Any):  # noqa: ANN201
    """A `Decoder` forward for a Hugging Face causal LM: logits of the last `num_logits`
    positions of `ids`, fed after `cache`."""

    def forward(ids, cache, num_logits):  # noqa: ANN001, ANN202
        with torch.inference_mode():
            out = model(
                input_ids=torch.tensor([list(ids)]),
                past_key_values=cache,
                logits_to_keep=num_logits,
            )
            return out.logits[0]

    return forward


def crop_cache(cache: Any, n: int) -> None:
    """A `Decoder` crop: drop the cache's last `n` positions (rejected draft tokens)."""
    if n:
        cache.crop(-n)


def decoder(
    model: Any,
    prompt: list[int],
    max_tokens: int,
    proposer: str | None = None,
    eos: frozenset[int] = frozenset(),
) -> Decoder:
    """A greedy `Decoder` of `prompt` on `model`, drafting with `proposer` (4 tokens) if named."""

    draft = PROPOSERS.get(proposer)(max_draft_tokens=4) if proposer else None
    params = SamplingParams(max_tokens=max_tokens)
    return Decoder(
        causal_lm_forward(model),
        crop_cache,
        transformers.DynamicCache(),
        prompt,
        params,
        eos,
        draft,
    )


def held_busy_request(loop: BatchLoop, model: Any, prompt: list[int], max_tokens: int):  # noqa: ANN201
    """Submit a request whose first decode step waits inside the loop; returns its slot and
    a `release()` to call once the requests that should be admitted together are queued
    (they join at the loop's next admission, all at once)."""
    import threading

    busy = decoder(model, prompt, max_tokens)
    gate, inside = threading.Event(), threading.Event()
    plain_forward = busy.forward

    def held(ids, cache, num_logits):  # noqa: ANN001, ANN202
        if len(ids) == 1 and not gate.is_set():
            inside.set()
            gate.wait(30)
        return plain_forward(ids, cache, num_logits)

    busy.forward = held
    slot = loop.submit(busy)
    assert inside.wait(30), "the busy request never reached its first decode step"
    return slot, gate.set
