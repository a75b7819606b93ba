"""Serving on a CUDA device: placement, greedy equality with `generate()` in bf16 on the
same device, batched rows on the device, the memory-fraction cap and sleep's release."""

import threading

import pytest
import torch

from argosy.serving import ENGINES, EngineConfig, GenerationRequest, SamplingParams
from argosy.serving.synthetic import write_checkpoint

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("smol-shape"), "smollm2-135m", "bfloat16")


def _engine(path, **fields):
    config = EngineConfig(model=str(path), speculative="off", max_context_tokens=1024, **fields)
    engine = ENGINES.get("transformers")(config)
    engine.load()
    return engine


def _request(engine, text, max_tokens=32, spec=None):
    ids = engine.encode_chat([{"role": "user", "content": text}])
    return GenerationRequest(tuple(ids), SamplingParams(max_tokens=max_tokens), spec)


def test_auto_places_the_model_on_the_gpu_in_bf16_and_matches_generate(checkpoint):
    engine = _engine(checkpoint)
    model = engine._model
    assert engine.placement.as_dict() == {"device": "cuda:0", "dtype": "bfloat16"}
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for text in ("Repeat the list", "write a short story about a ship", "0123 ,.;"):
        request = _request(engine, text)
        ours = list(engine.generate(request).token_ids)
        ids = torch.tensor([request.prompt_ids], device=model.device)
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None)
        assert ours == out[0, ids.shape[1] :].tolist()[: len(ours)] and ours


def test_concurrent_requests_batch_on_the_device_with_the_tokens_of_single_runs(checkpoint):
    engine = _engine(checkpoint, max_batch_size=16)
    texts = [f"write a short story about ship {i}" for i in range(12)]
    alone = [engine.generate(_request(engine, t, 16)).token_ids for t in texts]
    together: list = [None] * len(texts)

    def run(i):
        together[i] = engine.generate(_request(engine, texts[i], 16)).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.stats().batched_steps > 0
    same = sum(a == b for a, b in zip(alone, together, strict=True))
    assert same >= len(texts) - 2  # bf16 batched kernels may flip a near tie


def test_speculation_in_float32_on_the_gpu_keeps_the_plain_greedy_output(checkpoint):
    """The draft-and-verify logic is lossless: in float32 (no ties from rounding) drafted
    and plain greedy outputs are equal on the device. In bf16 a verify pass's rounding can
    flip an exact tie of the two best logits (benchmarks/serving_gpu.py reports how often)."""
    engine = _engine(checkpoint, dtype="float32")
    for text in ("Repeat the list: ship, ship, harbour, ship, harbour", "def mean(values):"):
        plain = engine.generate(_request(engine, text, 48)).token_ids
        assert engine.generate(_request(engine, text, 48, "ngram")).token_ids == plain


def test_sampling_with_a_seed_runs_on_the_gpu_and_repeats(checkpoint):
    engine = _engine(checkpoint)
    ids = engine.encode_chat([{"role": "user", "content": "a ship"}])
    params = SamplingParams(max_tokens=16, temperature=0.8, seed=7)
    first = engine.generate(GenerationRequest(tuple(ids), params)).token_ids
    assert first == engine.generate(GenerationRequest(tuple(ids), params)).token_ids


def test_memory_fraction_caps_the_allocator_and_sleep_gives_memory_back(checkpoint):
    before = torch.cuda.memory_allocated()  # earlier tests' engines live on in this process
    engine = _engine(checkpoint, memory_fraction=0.2)
    total = torch.cuda.get_device_properties(0).total_memory
    assert engine.budget is not None and engine.budget.device_bytes == total
    assert engine.budget.weights_bytes < 0.4e9  # 135M in bf16, not fp32
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(int(0.25 * total), dtype=torch.uint8, device="cuda")
    engine.generate(_request(engine, "hello", 8))
    engine.sleep()
    assert torch.cuda.memory_allocated() < before + 64 * 2**20
    engine.wake()
    assert engine.generate(_request(engine, "hello", 8)).token_ids
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
