"""Streaming detokenization per generated token: decode every id again (argosy before) vs
the incremental window of `argosy.serving.detokenize.TextStream`, side by side, with
SmolLM2's tokenizer. Prints milliseconds of tokenizer work per token at several output
lengths (medians of 5 runs) and the ratio; the work runs under the GIL the batch loop
needs, once per stream and step.

    .venv/bin/python benchmarks/serving_detokenize.py
"""

from __future__ import annotations

import statistics
import time

from argosy.serving.detokenize import TextStream
from argosy.serving.models import resolve
from argosy.serving.transformers_engine import load_tokenizer

LENGTHS = (128, 512, 2048, 8192)
TEXT = (
    "The planner prices every layout of the cluster, the checkpoint lands in memory first, "
    "and the launcher restarts a lost rank from its newest commit — naïvely, 3 × faster. "
)


def whole(decode, ids: list[int]) -> float:  # noqa: ANN001
    """Seconds to stream `ids` one at a time by decoding all ids at each step."""
    start, text = time.perf_counter(), ""
    for n in range(1, len(ids) + 1):
        full = decode(ids[:n])
        if not full.endswith("\ufffd"):
            text = full
    assert text == decode(ids)
    return time.perf_counter() - start


def window(decode, ids: list[int]) -> float:  # noqa: ANN001
    """Seconds to stream `ids` one at a time through `TextStream`."""
    start = time.perf_counter()
    stream = TextStream(decode)
    text = "".join(stream.push([t]) for t in ids) + stream.finish()
    assert text == decode(ids)
    return time.perf_counter() - start


def main() -> None:
    tok = load_tokenizer(resolve("smollm2-135m", None))
    base = tok.encode(TEXT * 400, add_special_tokens=False)

    def decode(ids):  # noqa: ANN001, ANN202
        return tok.decode(list(ids), skip_special_tokens=True)

    print("| output tokens | decode all, ms/token | window, ms/token | ratio |")
    print("|---:|---:|---:|---:|")
    for n in LENGTHS:
        ids = base[:n]
        a = statistics.median(whole(decode, ids) for _ in range(5)) / n * 1e3
        b = statistics.median(window(decode, ids) for _ in range(5)) / n * 1e3
        print(f"| {n} | {a:.3f} | {b:.3f} | {a / b:.1f}x |")


if __name__ == "__main__":
    main()
