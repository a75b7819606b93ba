"""The sampler as pure functions over random logits: a seeded draw at a position does not
depend on the draft (so speculation never changes a seeded request's tokens), penalties
subtract what OpenAI says from each row's own prefix, and logprobs are the rows'
log-softmax."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.serving.decoding import Decoder
from argosy.serving.types import SamplingParams

VOCAB = 12


def _decoder(params, prompt=(1, 2, 3)):
    return Decoder(lambda *a: None, lambda *a: None, None, prompt, params, frozenset())


params_st = st.builds(
    SamplingParams,
    max_tokens=st.just(64),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    seed=st.integers(0, 2**40),
    presence_penalty=st.sampled_from([0.0, 0.7, -0.5]),
    frequency_penalty=st.sampled_from([0.0, 1.3]),
    logprobs=st.sampled_from([None, 0, 3]),
)


@settings(max_examples=60, deadline=None)
@given(
    params=params_st,
    history=st.lists(st.integers(0, VOCAB - 1), max_size=6),
    draft=st.lists(st.integers(0, VOCAB - 1), max_size=5),
    logits_seed=st.integers(0, 2**31),
)
def test_a_verify_pass_keeps_exactly_the_tokens_plain_decoding_draws(
    params, history, draft, logits_seed
):
    rows = torch.randn(len(draft) + 1, VOCAB, generator=torch.Generator().manual_seed(logits_seed))
    speculative, plain = _decoder(params), _decoder(params)
    for d in (speculative, plain):
        d._emit(list(history))  # noqa: SLF001  the same generated prefix
    kept, _ = speculative.check(draft, rows, 0.0)
    drawn = []
    for i in range(len(kept[0])):
        token = plain.pick(rows[i : i + 1])
        drawn.append(token)
        plain._emit([token])  # noqa: SLF001
        if i < len(draft) and token != draft[i]:
            break
    assert kept[0] == drawn
    agree = kept[0][:-1]
    assert agree == draft[: len(agree)]
    if len(kept[0]) <= len(draft):
        assert kept[0][-1] != draft[len(kept[0]) - 1]
    assert speculative.logprobs == plain.logprobs


@settings(max_examples=40, deadline=None)
@given(
    history=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
    presence=st.floats(-2, 2),
    frequency=st.floats(-2, 2),
    logits_seed=st.integers(0, 2**31),
)
def test_greedy_with_penalties_takes_the_argmax_of_the_penalized_logits(
    history, presence, frequency, logits_seed
):
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency, logprobs=2)
    decoder = _decoder(params)
    decoder._emit(list(history))  # noqa: SLF001
    row = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(logits_seed))
    want = row[0].clone()
    for token in set(history):
        want[token] -= presence + frequency * history.count(token)
    assert decoder.pick(row) == int(want.argmax())
    decoder._emit([decoder.pick(row)])  # noqa: SLF001
    token, logprob, top = decoder.logprobs[-1]
    logp = torch.log_softmax(row[0], dim=-1)  # the model's own, before the penalties
    assert abs(logprob - float(logp[token])) < 1e-5
    assert [t for t, _ in top] == logp.topk(2).indices.tolist()


def test_unseeded_requests_differ_and_seeded_ones_repeat():
    row = torch.zeros(1, VOCAB)
    draws = {_decoder(SamplingParams(temperature=1.0)).pick(row) for _ in range(40)}
    assert len(draws) > 3
    seeded = {_decoder(SamplingParams(temperature=1.0, seed=5)).pick(row) for _ in range(10)}
    assert len(seeded) == 1
