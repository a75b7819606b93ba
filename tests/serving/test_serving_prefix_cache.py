"""Prefix cache and chunked prefill: the cache as a data structure (exact prefixes, LRU
bound), greedy output with the cache and chunking equal to output without, a running
stream stepping between a long prompt's chunks, and the engine's counters and sleep."""

import threading

import pytest
import torch
import transformers
from conftest import TINY_VOCAB
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_llama import (
    batch_loop,
    causal_lm_forward,
    crop_cache,
    decoder,
    held_busy_request,
    tiny_llama,
)

from argosy.serving.decoding import Decoder
from argosy.serving.metrics import render_metrics
from argosy.serving.prefill import ChunkSizer
from argosy.serving.prefix_cache import PrefixCache
from argosy.serving.types import SamplingParams


def _layers(tokens, num_layers=2):
    """A fake KV whose position t holds token t's id (keys) and minus it (values)."""
    keys = torch.tensor(tokens, dtype=torch.float32).reshape(1, 1, -1, 1).repeat(1, 2, 1, 3)
    return [(keys + i, -keys - i) for i in range(num_layers)]


def test_a_prompt_reuses_the_longest_cached_block_aligned_prefix():
    cache = PrefixCache(block_tokens=4, capacity_tokens=64)
    cache.insert(list(range(10)), _layers(list(range(10))))  # blocks [0..3], [4..7]
    reused, layers = cache.match([0, 1, 2, 3, 4, 5, 6, 7, 99])
    assert reused == 8
    assert torch.equal(layers[1][0], _layers(list(range(8)))[1][0])
    assert cache.match([0, 1, 2, 3, 4, 5, 6, 7])[0] == 4  # one token is always left to feed
    assert cache.match([0, 1, 2, 9, 4, 5, 6, 7, 8])[0] == 0  # a block differs: miss
    assert cache.stats.hits == 2 and cache.stats.reused_tokens == 12


def test_the_least_recently_used_leaves_go_first():
    cache = PrefixCache(block_tokens=2, capacity_tokens=6)
    cache.insert([1, 2, 3, 4], _layers([1, 2, 3, 4]))
    cache.insert([5, 6], _layers([5, 6]))
    cache.match([1, 2, 3, 4, 0])  # [1,2] and [3,4] are fresher than [5,6]
    cache.insert([7, 8], _layers([7, 8]))  # 4 blocks > 3: [5,6] goes
    assert cache.match([5, 6, 0])[0] == 0
    assert cache.match([1, 2, 3, 4, 0])[0] == 4
    cache.insert([9, 9], _layers([9, 9]))  # [7,8] is now the oldest
    assert cache.match([7, 8, 0])[0] == 0
    cache.insert([8, 8], _layers([8, 8]))  # the leaf [3,4] goes before its root [1,2]
    assert cache.match([1, 2, 3, 4, 0])[0] == 2
    assert cache.stats.evicted_blocks == 3
    cache.clear()
    assert cache.cached_tokens == 0 and cache.match([1, 2, 3, 4, 0])[0] == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=14), min_size=1, max_size=12),
    st.integers(1, 4),
    st.integers(0, 12),
)
def test_the_cache_returns_only_exact_prefixes_within_its_bound(prompts, block, capacity):
    cache = PrefixCache(block_tokens=block, capacity_tokens=capacity)
    for prompt in prompts:
        reused, layers = cache.match(prompt)
        assert reused % block == 0 and reused < len(prompt)
        if reused:
            assert torch.equal(layers[0][0], _layers(prompt[:reused])[0][0])
            assert torch.equal(layers[1][1], _layers(prompt[:reused])[1][1])
        cache.insert(prompt, _layers(prompt))
        assert cache.cached_tokens <= capacity


def test_chunk_sizes_follow_the_decode_step_time():
    sizer = ChunkSizer(chunk_tokens=512, stall_ratio=1.0, min_tokens=16)
    assert sizer.size(4000, decoding=True) == 16  # nothing measured yet: a probe
    assert sizer.size(4000, decoding=False) == 512
    sizer.observe_step(0.2)
    sizer.observe_chunk(512, 512 * 0.005)
    assert sizer.size(4000, decoding=True) == 40  # 0.2 s of prefill at 5 ms a token
    assert sizer.size(4000, decoding=False) == 512  # nobody waits: full chunks
    assert sizer.size(7, decoding=True) == 7
    sizer.observe_step(0.2 * 10)  # moving averages: 0.7 x 0.2 + 0.3 x 2 = 0.74 s
    assert sizer.size(4000, decoding=True) == 148
    quick = ChunkSizer(chunk_tokens=512, stall_ratio=1.0, min_tokens=16)
    quick.observe_step(0.01)
    quick.observe_chunk(10, 0.05)
    assert quick.size(4000, decoding=True) == 16  # never below the floor
    assert ChunkSizer(chunk_tokens=0).size(4000, decoding=True) == 4000


@pytest.fixture(scope="module")
def model64():
    """A tiny Llama in float64 with weights large enough (init 0.2, not 0.02) that attention
    is sharp: a reused KV in the wrong order or scale changes the output (with near-uniform
    attention it would not), and chunked and whole prefills agree far below argmax ties."""
    return tiny_llama(TINY_VOCAB, initializer_range=0.2).double()


def _solo(model, prompt, max_tokens):
    return [t for new, _ in decoder(model, prompt, max_tokens) for t in new]


def _run_all(loop, model, prompts, max_tokens, proposer=None):
    slots = [loop.submit(decoder(model, p, max_tokens, proposer)) for p in prompts]
    return [[t for new, _ in slot.chunks() for t in new] for slot in slots]


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.integers(1, TINY_VOCAB - 1), min_size=8, max_size=40),
    st.lists(
        st.tuples(
            st.integers(0, 40), st.lists(st.integers(1, TINY_VOCAB - 1), min_size=1, max_size=9)
        ),
        min_size=2,
        max_size=5,
    ),
    st.sampled_from([None, "ngram"]),
)
def test_greedy_output_is_the_same_with_and_without_the_cache(model64, shared, tails, proposer):
    prompts = [shared[:cut] + tail for cut, tail in tails]
    want = [_solo(model64, p, 6) for p in prompts]
    loop = batch_loop(model64, 4, prefix_cache=PrefixCache(4, 256), chunks=ChunkSizer(8, 0.0))
    assert _run_all(loop, model64, prompts, 6, proposer) == want  # concurrent
    assert _run_all(loop, model64, prompts, 6, proposer) == want  # every block cached
    assert loop.prefix_cache.stats.hits >= sum(len(p) > 4 for p in prompts)


def test_identical_prompts_share_every_full_block(model64):
    loop = batch_loop(model64, 8, prefix_cache=PrefixCache(4, 256))
    prompt = [5, 9, 2, 5, 9, 11, 3, 3, 7, 1, 2]
    got = _run_all(loop, model64, [prompt] * 4, 5)
    assert got == [_solo(model64, prompt, 5)] * 4
    stats = loop.prefix_cache.stats
    # arriving together, the four are computed once in one pass; one after another, the
    # first computes and the rest reuse its two full blocks: never more than that
    assert stats.reused_tokens in (0, 8, 16, 24)
    assert loop.prefilled_rows + stats.reused_tokens // 8 <= 4
    reused = stats.reused_tokens
    later = _run_all(loop, model64, [prompt], 5)  # every full block is cached by now
    assert later == [_solo(model64, prompt, 5)]
    assert loop.prefix_cache.stats.reused_tokens == reused + 8


def test_a_burst_of_short_prompts_is_prefilled_in_one_pass(model64):
    """Prompts admitted together go through one left-padded pass (identical ones once),
    after caches of different lengths from the prefix cache; each decodes as it would
    alone, and the pass stores every full block it computed."""
    loop = batch_loop(model64, 8, prefix_cache=PrefixCache(4, 256), chunks=ChunkSizer(64, 0.0))
    shared = [5, 9, 2, 5, 9, 11, 3, 3]
    _run_all(loop, model64, [shared + [1]], 2)  # caches the two blocks of `shared`
    first, release = held_busy_request(loop, model64, [1, 2, 3], 6)
    prompts = [shared + [4, 4], shared[:4] + [7], [6, 1, 6, 1, 6, 2], shared + [4, 4]]
    before = (loop.prefill_chunks, loop.prefilled_rows)
    slots = [loop.submit(decoder(model64, p, 7)) for p in prompts]
    release()
    got = [[t for new, _ in slot.chunks() for t in new] for slot in slots]
    assert got == [_solo(model64, p, 7) for p in prompts]
    assert [t for new, _ in first.chunks() for t in new] == _solo(model64, [1, 2, 3], 6)
    assert (loop.prefill_chunks, loop.prefilled_rows) == (before[0] + 1, before[1] + 3)
    reused = loop.prefix_cache.stats.reused_tokens
    assert _run_all(loop, model64, [[6, 1, 6, 1, 6, 2, 8]], 3)[0] == _solo(
        model64, [6, 1, 6, 1, 6, 2, 8], 3
    )
    assert loop.prefix_cache.stats.reused_tokens == reused + 4  # stored by the joint pass


def _tagged(model, tag, log, prompt, max_tokens):
    """A greedy decoder whose every forward pass is logged as (tag, tokens fed)."""
    plain = causal_lm_forward(model)

    def forward(ids, cache, num_logits):
        log.append((tag, len(ids)))
        return plain(ids, cache, num_logits)

    params = SamplingParams(max_tokens=max_tokens)
    cache = transformers.DynamicCache()
    return Decoder(forward, crop_cache, cache, prompt, params, frozenset())


def test_a_running_stream_steps_between_the_chunks_of_a_long_prompt(model64):
    log: list[tuple[str, int]] = []
    loop = batch_loop(model64, 4, chunks=ChunkSizer(chunk_tokens=16, stall_ratio=0.0))
    running = loop.submit(_tagged(model64, "run", log, [1, 2, 3], 40)).chunks()
    next(running)  # the stream is decoding
    long_prompt = [(7 * i) % (TINY_VOCAB - 1) + 1 for i in range(100)]
    late = loop.submit(_tagged(model64, "long", log, long_prompt, 4))
    got_late = [t for new, _ in late.chunks() for t in new]
    got_run = [t for new, _ in running for t in new]
    chunks = [i for i, (tag, _) in enumerate(log) if tag == "long"]
    assert [log[i][1] for i in chunks] == [16] * 6 + [4]  # 100 tokens in 16-token chunks
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert ("run", 1) in log[before + 1 : after]  # the stream stepped in between
    assert got_late == _solo(model64, long_prompt, 4)
    assert got_run == _solo(model64, [1, 2, 3], 40)[1:]  # the first came before


def test_a_cancelled_prefill_stops_and_the_others_run_on(model64):
    submitted = threading.Event()
    slots = []
    plain = causal_lm_forward(model64)

    def hang_up(ids, cache, num_logits):  # the client hangs up during the first chunk
        submitted.wait(10)
        slots[0].cancelled = True
        return plain(ids, cache, num_logits)

    loop = batch_loop(model64, 4, chunks=ChunkSizer(chunk_tokens=4, stall_ratio=0.0))
    params = SamplingParams(max_tokens=4)
    cache = transformers.DynamicCache()
    prompt = list(range(1, 41))
    slots.append(loop.submit(Decoder(hang_up, crop_cache, cache, prompt, params, frozenset())))
    submitted.set()
    kept = loop.submit(decoder(model64, [3, 1, 4, 1, 5], 5))
    assert [t for new, _ in kept.chunks() for t in new] == _solo(model64, [3, 1, 4, 1, 5], 5)
    assert loop.prefill_chunks == 3  # one of the cancelled prompt's ten, then 4 + 1


def test_the_engine_counts_hits_and_a_sleep_drops_the_cache(smol_engine):
    from argosy.serving.types import GenerationRequest

    prompt = tuple(range(1000, 1000 + 100))
    request = GenerationRequest(prompt, SamplingParams(max_tokens=4), speculative="off")
    first = smol_engine.generate(request)
    second = smol_engine.generate(request)
    assert first.token_ids == second.token_ids
    stats = smol_engine.stats().prefix_cache
    assert stats["hits"] >= 1 and stats["reused_tokens"] >= 96 and stats["cached_tokens"] >= 96
    text = render_metrics(smol_engine.stats())
    assert "argosy_serving_prefix_cache_hits_total" in text
    assert "argosy_serving_prefix_cache_reused_tokens_total" in text
    smol_engine.sleep(1)
    assert smol_engine.stats().prefix_cache["cached_tokens"] == 0
    smol_engine.wake()
    hits = smol_engine.stats().prefix_cache["hits"]
    assert smol_engine.generate(request).token_ids == first.token_ids
    assert smol_engine.stats().prefix_cache["hits"] == hits  # nothing was left to hit


@pytest.mark.parametrize(
    "setting",
    ["prefix_cache_tokens=-1", "prefix_cache_tokens", "no_such_knob=1", "memory_fraction=0.5"],
)
def test_serve_refuses_bad_settings_with_exit_2(setting):
    from typer.testing import CliRunner

    from argosy.cli.app import app

    result = CliRunner().invoke(app, ["serve", "--set", setting])
    assert result.exit_code == 2
    assert "--set" in result.output


def test_a_launch_bound_pass_gets_full_chunks_and_a_compute_bound_one_is_cut():
    """Seconds are fitted as fixed + per token: on a GPU, where a 16-token chunk costs
    what a 400-token one does (the launches), chunks grow to the cap; on a CPU, where the
    cost is per token, they are cut to the decode step's time as before."""
    gpu = ChunkSizer(chunk_tokens=512, stall_ratio=1.0, min_tokens=16)
    gpu.observe_step(0.025)
    gpu.observe_chunk(400, 0.0262)  # nothing decoding: a whole prompt in one chunk
    gpu.observe_chunk(16, 0.0250)  # while streams decode: the first probe
    assert gpu.token_s is not None and gpu.token_s < 1e-5
    assert gpu.size(4000, decoding=True) == 512
    cpu = ChunkSizer(chunk_tokens=512, stall_ratio=1.0, min_tokens=16)
    cpu.observe_step(0.2)
    cpu.observe_chunk(400, 400 * 0.005 + 0.001)
    cpu.observe_chunk(16, 16 * 0.005 + 0.001)
    assert abs(cpu.size(4000, decoding=True) - 40) <= 1  # 0.2 s more work at 5 ms a token


def test_a_prompt_finished_beside_another_stores_the_blocks_of_its_own_chunks(model64):
    """A 9-token prompt over a chunk budget of 8: its first chunk alone, its last token in
    one pass beside a short prompt. The positions of its own first chunk were computed
    here, not reused: its full blocks are stored (they were skipped as if reused), and
    the same prompts again reuse them."""
    long, short = [7, 8, 9, 10, 11, 12, 13, 14, 1], [3, 1]
    loop = batch_loop(model64, 4, prefix_cache=PrefixCache(4, 256), chunks=ChunkSizer(8, 0.0))
    want = [_solo(model64, p, 6) for p in (long, short)]
    assert _run_all(loop, model64, [long, short], 6) == want
    assert loop.prefix_cache.stats.inserted_blocks == 2
    assert _run_all(loop, model64, [long, short], 6) == want
    assert loop.prefix_cache.stats.reused_tokens >= 8
