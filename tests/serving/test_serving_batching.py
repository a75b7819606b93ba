"""Continuous batching: requests admitted at any time between steps decode to exactly what
they decode to alone, and the loop really batches (several rows in one forward pass)."""

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_llama import batch_loop, decoder, held_busy_request

VOCAB = 48


def _loop(model, max_batch_size=8):
    return batch_loop(model, max_batch_size)


def _solo(model, prompt, max_tokens, eos=frozenset()):
    return [t for new, _ in decoder(model, prompt, max_tokens, eos=eos) for t in new]


requests_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),  # prompt
        st.integers(1, 12),  # max_tokens
        st.integers(0, 6),  # tokens the previous request has produced before this one joins
        st.sampled_from([None, "ngram", "auto"]),
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(requests=requests_strategy, max_batch_size=st.integers(1, 4), staged=st.booleans())
def test_requests_joining_mid_flight_decode_exactly_as_alone(
    tiny_model, requests, max_batch_size, staged
):
    """Staged: prompts queued together are prefilled in joint passes after caches of
    different lengths from the prefix cache (the second request of a prompt hits it)."""
    from argosy.serving.prefill import ChunkSizer
    from argosy.serving.prefix_cache import PrefixCache

    staging = {"prefix_cache": PrefixCache(2, 512), "chunks": ChunkSizer(16, 0.0)}
    loop = batch_loop(tiny_model, max_batch_size, **(staging if staged else {}))
    eos = frozenset({7})
    streams, outputs = [], []
    for prompt, max_tokens, join_after, proposer in requests:
        if streams:  # the previous request makes progress before this one joins
            for _ in range(join_after):
                step = next(streams[-1], None)
                if step is None:
                    break
                outputs[-1].extend(step[0])
                assert loop.running <= max_batch_size
        streams.append(loop.submit(decoder(tiny_model, prompt, max_tokens, proposer, eos)).chunks())
        outputs.append([])
    for steps, out in zip(streams, outputs, strict=True):
        for new, _ in steps:
            out.extend(new)
    for (prompt, max_tokens, _, _), out in zip(requests, outputs, strict=True):
        assert out == _solo(tiny_model, prompt, max_tokens, eos)


@pytest.mark.slow
def test_concurrent_requests_are_batched_and_equal_their_solo_outputs(tiny_model):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (3 + i % 7,), generator=gen).tolist() for i in range(12)]
    want = [_solo(tiny_model, p, 16) for p in prompts]
    loop = _loop(tiny_model, max_batch_size=5)
    got: list = [None] * len(prompts)

    def run(i):
        slot = loop.submit(decoder(tiny_model, prompts[i], 16))
        got[i] = [t for new, _ in slot.chunks() for t in new]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert got == want
    assert loop.batch_steps > 0 and loop.batched_tokens / loop.batch_steps > 1.5


@pytest.mark.slow
def test_a_cancelled_request_leaves_the_others_running(tiny_model):
    loop = _loop(tiny_model)
    keep = loop.submit(decoder(tiny_model, [1, 2, 3], 20))
    drop = loop.submit(decoder(tiny_model, [4, 5, 6], 200))
    dropped = drop.chunks()
    next(dropped)
    dropped.close()  # a client hanging up
    got = [t for new, _ in keep.chunks() for t in new]
    assert got == _solo(tiny_model, [1, 2, 3], 20)


def test_identical_prompts_admitted_together_are_prefilled_once(tiny_model):
    loop = _loop(tiny_model, max_batch_size=8)
    first, release = held_busy_request(loop, tiny_model, [1, 2, 3], 6)
    prompt = [5, 9, 2, 5, 9, 11]
    slots = [loop.submit(decoder(tiny_model, prompt, 5)) for _ in range(4)]
    slots.append(loop.submit(decoder(tiny_model, [4, 4, 8], 5)))
    release()
    got = [[t for new, _ in slot.chunks() for t in new] for slot in [first, *slots]]
    assert loop.prefilled_rows == 2  # two distinct prompts for five newcomers
    assert got[1:] == [_solo(tiny_model, prompt, 5)] * 4 + [_solo(tiny_model, [4, 4, 8], 5)]
    assert got[0] == _solo(tiny_model, [1, 2, 3], 6)


@pytest.mark.parametrize("staged", [False, True], ids=["prefill-at-admission", "staged-prefill"])
def test_a_newcomer_joins_without_splitting_the_running_rows(tiny_model, staged):
    """On a GPU a decode step is launch-bound: a join that split every running row's cache
    and padded it back (thousands of small copies at 64 rows) cost more than the step. A
    join costs a few operations per layer whatever the number of rows: no request's own
    cache is rebuilt while the batch runs, and every output is still its solo output."""
    from argosy.serving.prefill import ChunkSizer

    loop = batch_loop(tiny_model, 8, chunks=ChunkSizer(4, 0.0) if staged else None)
    plain_make = loop.make_cache
    per_request: list[int] = []  # rows of each cache the loop built

    def counting(layers):
        per_request.append(layers[0][0].shape[0] if layers else 0)
        return plain_make(layers)

    loop.make_cache = counting
    prompts = [[3 + i, 5, 7 + i, 1][: 2 + i % 3] for i in range(6)]
    streams, outputs = [], []
    for prompt in prompts:
        if streams:  # the rows already running make a step before the next one joins
            outputs[-1].extend(next(streams[-1])[0])
        streams.append(loop.submit(decoder(tiny_model, prompt, 24)).chunks())
        outputs.append([])
    for steps, out in zip(streams, outputs, strict=True):
        for new, _ in steps:
            out.extend(new)
    assert outputs == [_solo(tiny_model, p, 24) for p in prompts]
    assert loop.batch_steps > 0
    # one batched cache per join, and one request's own cache when a single row remains
    assert per_request.count(1) <= 1, per_request
