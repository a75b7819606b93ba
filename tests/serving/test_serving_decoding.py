"""The decode loop is lossless: greedy output with any proposer equals plain greedy output,
and with sampling every token is distributed as the target's probabilities."""

import pytest
import torch
import transformers
from tiny_llama import causal_lm_forward, crop_cache

from argosy.serving.decoding import Decoder
from argosy.serving.speculative import PROPOSERS, ProposerContext
from argosy.serving.types import SamplingParams


def _decode(model, prompt, proposer_name, max_tokens=32, params=None, arg=None):
    context = ProposerContext(target=model, arg=arg)
    proposer = (
        PROPOSERS.get(proposer_name)(max_draft_tokens=6, context=context) if proposer_name else None
    )
    decoder = Decoder(
        causal_lm_forward(model),
        crop_cache,
        transformers.DynamicCache(),
        prompt,
        params or SamplingParams(max_tokens=max_tokens),
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


@pytest.fixture(scope="module")
def draft_dir(tiny_model, tmp_path_factory):
    """A one-layer copy of the tiny model saved as a draft checkpoint."""
    from argosy.serving.speculative.draft import early_exit_view

    path = tmp_path_factory.mktemp("draft")
    early_exit_view(tiny_model, 1).save_pretrained(path)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("proposer", ["ngram", "auto", "self", "draft"])
def test_greedy_speculation_is_token_for_token_plain(tiny_model, draft_dir, proposer):
    arg = draft_dir if proposer == "draft" else None
    accepted = rejected = 0
    for prompt in _prompts(40):
        want, _ = _decode(tiny_model, prompt, None)
        got, counters = _decode(tiny_model, prompt, proposer, arg=arg)
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


@pytest.mark.slow
def test_sampling_with_the_self_draft_keeps_the_real_models_distribution(tiny_model):
    prompt = [5, 9, 2, 5, 9]
    temperature = 0.7
    with torch.inference_mode():  # exact p(second token) = sum over t1 of p(t1) p(t2 | t1)
        first = torch.softmax(tiny_model(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        batch = torch.tensor([[*prompt, t] for t in range(48)])
        second = torch.softmax(tiny_model(batch).logits[:, -1] / temperature, -1)
    want = first @ second
    num = 1500
    counts = torch.zeros(48)
    drafted = 0
    for seed in range(num):
        params = SamplingParams(max_tokens=3, temperature=temperature, seed=seed)
        tokens, counters = _decode(tiny_model, prompt, "self", params=params)
        counts[tokens[1]] += 1
        drafted += counters.drafted
    assert drafted == num  # the second token always went through a verify pass
    total_variation = 0.5 * (counts / num - want).abs().sum().item()
    assert total_variation < 0.12, total_variation
