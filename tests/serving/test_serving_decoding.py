"""The decode loop is lossless: greedy output with any proposer equals plain greedy output,
and with sampling every token is distributed as the target's probabilities."""

import pytest
import torch
import transformers

from argosy.serving.decoding import Decoder
from argosy.serving.speculative import PROPOSERS
from argosy.serving.types import SamplingParams


@pytest.fixture(scope="module")
def tiny_model():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _decode(model, prompt, proposer_name, max_tokens=32):
    def forward(ids, cache, num_logits):
        with torch.inference_mode():
            out = model(
                input_ids=torch.tensor([list(ids)]),
                past_key_values=cache,
                logits_to_keep=num_logits,
            )
            return out.logits[0]

    def crop(cache, n):
        if n:
            cache.crop(-n)

    proposer = PROPOSERS.get(proposer_name)(max_draft_tokens=6) if proposer_name else None
    decoder = Decoder(
        forward,
        crop,
        transformers.DynamicCache(),
        prompt,
        SamplingParams(max_tokens=max_tokens),
        frozenset(),
        proposer,
    )
    out = [t for new, _ in decoder for t in new]
    return out, decoder.counters


def _prompts(num):
    gen = torch.Generator().manual_seed(1)
    prompts = []
    for i in range(num):
        base = torch.randint(0, 48, (6 + i % 5,), generator=gen).tolist()
        prompts.append(base * (1 + i % 3) + base[: i % 4])  # repeats give n-gram matches
    return prompts


@pytest.mark.slow
@pytest.mark.parametrize("proposer", ["ngram", "auto"])
def test_greedy_speculation_is_token_for_token_plain(tiny_model, proposer):
    accepted = rejected = 0
    for prompt in _prompts(40):
        want, _ = _decode(tiny_model, prompt, None)
        got, counters = _decode(tiny_model, prompt, proposer)
        assert got == want, prompt
        accepted += counters.accepted
        rejected += counters.drafted - counters.accepted
    assert accepted > 0 and rejected > 0  # both verify branches were exercised


class _FixedModel:
    """Same next-token distribution at every position; a proposer that always drafts [0, 1]."""

    def __init__(self, probs):
        self.logits = torch.log(torch.tensor(probs))

    def forward(self, ids, cache, num_logits):
        return self.logits.repeat(num_logits, 1)

    def propose(self, context, max_tokens):
        return [0, 1][:max_tokens]


@pytest.mark.slow
def test_sampling_with_speculation_keeps_the_target_distribution():
    want = [0.5, 0.2, 0.2, 0.1]
    fixed = _FixedModel(want)
    counts = torch.zeros(3, 4)
    num = 3000
    for seed in range(num):
        params = SamplingParams(max_tokens=4, temperature=1.0, seed=seed)
        decoder = Decoder(fixed.forward, lambda c, n: None, None, [3], params, frozenset(), fixed)
        tokens = [t for new, _ in decoder for t in new]
        for pos in range(1, 4):  # positions decided by verify passes
            counts[pos - 1, tokens[pos]] += 1
    freq = counts / num
    # binomial standard error at p=0.5, n=3000 is 0.009; allow ~4 sigma
    assert torch.allclose(freq, torch.tensor([want] * 3), atol=0.035), freq
