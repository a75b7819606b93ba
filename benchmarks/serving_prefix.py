"""Long prompts (issue 35, item 6): the prefix cache and chunked prefill, peers in one run.

Two workloads on the `transformers` engine in this process (SmolLM2-135M, greedy,
speculation off, random token ids so no tokenizer effects):

- `shared`: `--requests` prompts of `--prompt-tokens` tokens that share their first
  `--prefix-tokens`, all submitted at once, `--max-tokens` each; requests/s with the
  prefix cache against without it (target >= 2x), at each `--stall-ratios` value
  (`prefill_stall_ratio`: 1, the default, keeps prefill to about half the time while
  streams decode; 0 lets prefill chunks run at full size);
- `itl`: `--streams` streams decode; once each has its first token a prompt of
  `--long-tokens` arrives; the streams' inter-token times while it is prefilled, p99
  against median (target p99 <= 2x median), chunked prefill (`prefill_chunk_tokens` 512,
  `prefill_stall_ratio` 1) against whole-prompt prefill.

The sides of each workload alternate `--repeats` times; it prints one JSON object (medians
and ratios).

    .venv/bin/python benchmarks/serving_prefix.py                          # scaled (2 cores)
    .venv/bin/python benchmarks/serving_prefix.py --requests 16 --prompt-tokens 4096 \\
        --prefix-tokens 3584 --long-tokens 4096                           # the issue's sizes
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import threading
import time
from typing import Any

from argosy.serving import ENGINES, EngineConfig
from argosy.serving.types import GenerationRequest, SamplingParams


def _engine(**knobs: Any) -> Any:
    config = EngineConfig(model="smollm2-135m", speculative="off", num_threads=2, **knobs)
    engine = ENGINES.get("transformers")(config)
    engine.load()
    return engine


def _ids(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(count)]


def shared_prefix(engine: Any, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Requests/s of `--requests` prompts sharing a prefix, submitted together."""
    rng = random.Random(seed)
    prefix = _ids(rng, args.prefix_tokens)
    prompts = [
        prefix + _ids(rng, args.prompt_tokens - args.prefix_tokens) for _ in range(args.requests)
    ]
    params = SamplingParams(max_tokens=args.max_tokens)
    outputs: list[tuple[int, ...]] = [()] * len(prompts)

    def one(i: int) -> None:
        outputs[i] = engine.generate(GenerationRequest(tuple(prompts[i]), params)).token_ids

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "requests_per_s": len(prompts) / seconds,
        "outputs": hash(tuple(outputs)),
    }


def inter_token(engine: Any, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """The running streams' inter-token times while a long prompt is prefilled."""
    rng = random.Random(seed)
    gaps: list[tuple[float, float]] = []  # (time of the token, gap before it)
    started = threading.Barrier(args.streams + 1)
    lock = threading.Lock()

    def stream() -> None:
        request = GenerationRequest(
            tuple(_ids(rng, 32)), SamplingParams(max_tokens=args.stream_tokens)
        )
        last = None
        for _ in engine.stream(request):
            now = time.perf_counter()
            if last is None:
                started.wait()
            else:
                with lock:
                    gaps.append((now, now - last))
            last = now

    threads = [threading.Thread(target=stream) for _ in range(args.streams)]
    for thread in threads:
        thread.start()
    started.wait()
    arrive = time.perf_counter()
    long_request = GenerationRequest(
        tuple(_ids(rng, args.long_tokens)), SamplingParams(max_tokens=1)
    )
    first = engine.generate(long_request)
    done = arrive + first.ttft_s
    for thread in threads:
        thread.join()
    during = sorted(g for t, g in gaps if arrive <= t <= done + 0.5)
    every = sorted(g for _, g in gaps)
    median = statistics.median(every)
    p99 = during[min(len(during) - 1, int(0.99 * len(during)))] if during else 0.0
    return {
        "long_prefill_s": first.ttft_s,
        "median_itl_s": median,
        "p99_itl_during_prefill_s": p99,
        "max_itl_during_prefill_s": max(during, default=0.0),
        "p99_over_median": p99 / median,
        "p90_itl_during_prefill_s": during[int(0.9 * len(during))] if during else 0.0,
        "slowest_5_during_s": during[-5:],
        "samples_during": len(during),
        "prefill_chunks": engine.stats().prefill_chunks,
    }


def _sides(name: str, sides: dict[str, Any], run: Any, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        for side, engine in sides.items():
            results[side].append(run(engine, args, seed=repeat))
            print(name, side, json.dumps(results[side][-1]), flush=True)
    return {
        side: {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "outputs"}
        for side, runs in results.items()
    } | {"same_outputs": _same(results)}


def _same(results: dict[str, list[dict[str, float]]]) -> bool:
    runs = list(results.values())
    return all(
        "outputs" not in a or a["outputs"] == b["outputs"] for a, b in zip(*runs, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--prefix-tokens", type=int, default=896)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--stream-tokens", type=int, default=160)
    parser.add_argument("--long-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stall-ratios", default="1,0")
    parser.add_argument("--parts", default="shared,itl")
    args = parser.parse_args()
    report: dict[str, Any] = {"machine": platform.node(), "args": vars(args)}
    parts = args.parts.split(",")
    for ratio in [float(r) for r in args.stall_ratios.split(",")] if "shared" in parts else []:
        sides = {
            "no_cache": _engine(prefix_cache_tokens=0, prefill_stall_ratio=ratio),
            "prefix_cache": _engine(prefill_stall_ratio=ratio),
        }
        part = report[f"shared_stall_{ratio:g}"] = _sides("shared", sides, shared_prefix, args)
        part["ratio"] = part["prefix_cache"]["requests_per_s"] / part["no_cache"]["requests_per_s"]
        del sides
    if "itl" in parts:
        sides = {
            "whole_prompt": _engine(prefix_cache_tokens=0, prefill_chunk_tokens=0),
            "chunked": _engine(prefix_cache_tokens=0),
        }
        report["itl"] = _sides("itl", sides, inter_token, args)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
