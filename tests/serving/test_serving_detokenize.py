"""Incremental detokenization: the deltas add up to the text of all tokens, with either
tokenizer argosy serves (the synthetic byte-level BPE and SmolLM2's), at any chunking."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.serving.detokenize import REPLACEMENT, TextStream


@functools.cache
def _tokenizer(name: str):  # noqa: ANN202
    if name == "synthetic":
        from argosy.serving.synthetic import _tokenizer as synthetic

        return synthetic()
    from argosy.serving.models import resolve
    from argosy.serving.transformers_engine import load_tokenizer

    return load_tokenizer(resolve("smollm2-135m", None))


def _decode(tok):  # noqa: ANN001, ANN202
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True)


TEXTS = ["héllo wörld ✓ 日本語 — naïve café", "def f(x):\n    return x ** 2  # ok", "🙂🙃 a b"]


def _chunked(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, i = [], 0
    for size in sizes:
        if i >= len(ids):
            break
        out.append(ids[i : i + size])
        i += size
    return out + ([ids[i:]] if i < len(ids) else [])


@pytest.mark.parametrize("name", ["synthetic", "smollm2"])
@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=80),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=80),
    text=st.sampled_from(TEXTS),
)
def test_deltas_add_up_to_the_text_of_all_tokens(
    name: str, picks: list[int], sizes: list[int], text: str
) -> None:
    """Random token ids (split UTF-8 characters included) and real text's ids, pushed in
    random chunks: every delta is whole characters, and they join to decode(all)."""
    tok = _tokenizer(name)
    real = tok.encode(text, add_special_tokens=False)
    ids = [p % len(tok) for p in picks] if picks[0] % 2 else real + [p % 300 for p in picks]
    decode = _decode(tok)
    stream = TextStream(decode)
    deltas = [stream.push(chunk) for chunk in _chunked(ids, sizes)]
    assert all(REPLACEMENT not in d or REPLACEMENT in decode(ids) for d in deltas)
    assert "".join(deltas) + stream.finish() == decode(ids)


@pytest.mark.parametrize("name", ["synthetic", "smollm2"])
def test_the_window_stays_short_however_long_the_text(name: str) -> None:
    """The decoded window never holds more than the last two deltas' tokens (plus a
    partial character): the cost per step does not grow with the stream."""
    tok = _tokenizer(name)
    ids = tok.encode(TEXTS[0] * 40, add_special_tokens=False)
    seen: list[int] = []

    def decode(window):  # noqa: ANN001, ANN202
        seen.append(len(window))
        return tok.decode(list(window), skip_special_tokens=True)

    stream = TextStream(decode)
    text = "".join(stream.push([t]) for t in ids) + stream.finish()
    assert text == tok.decode(ids, skip_special_tokens=True)
    assert len(ids) > 400 and max(seen) <= 8
