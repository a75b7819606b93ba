"""Health under load: `/health`, `/live`, `/metrics` and `/v1/models` latency while N clients
stream from `argosy serve` (issue 35).

    nice -n 10 .venv/bin/python benchmarks/serving_load.py                   # ~6 min, 2 cores
    .venv/bin/python benchmarks/serving_load.py --clients 64,128 --seconds 40 --json load.json

Peers, side by side in one run, each a real `argosy serve` process (smollm2-135m, fp32,
speculation off, one torch thread) on its own port, one at a time:
- `argosy` : this checkout's server;
- `before` : the server as it was before issue 35 (`--base`, a commit: its `argosy/` is
  extracted with `git archive` to a temporary directory and run with the same venv).

For each peer and each client count N, N streaming clients (`max_tokens` 256, greedy,
each restarting when its stream ends, so N streams stay open) load the server for
`--warmup` seconds; then a prober sends `GET /health`, `/live`, `/metrics`, `/v1/models`
in turn every 50 ms for `--seconds` seconds (timeout 5 s: a timeout counts as 5 s). It
prints p50/p99/max per route, the number of probe failures (non-200 or timeout), tokens/s
streamed and the stream errors, then the ratio of each route's p99 to `before`'s. Target:
`/health` p99 < 50 ms at 64 and 128 clients. The clients and the prober share one event
loop in this process (httpx, asyncio); this 2-core VM is shared, so read medians and
ratios.

`--big` first sends each peer a 4 MB and a 10 MB prompt (one at a time, no other load),
timing the answer (this server: 413 from the body limit) and a `/v1/models` request sent
0.2 s into each, and reads the serving processes' RSS (HTTP process plus worker) before
and 2 s after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
ROUTES = ("/health", "/live", "/metrics", "/v1/models")
PROBE_TIMEOUT_S = 5.0
PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain, step by step and at length, how a steam engine works.",
    "List as many animals as you can, with one sentence about each.",
    "Describe a walk through a busy market in great detail.",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _extract(commit: str) -> Path:
    """The `argosy/` package of `commit` in a temporary directory (for PYTHONPATH)."""
    where = Path(tempfile.mkdtemp(prefix="argosy-base-"))
    archive = subprocess.run(
        ["git", "archive", commit, "argosy"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where)  # noqa: S202 (this repository's own archive)
    return where


@contextlib.contextmanager
def _server(pythonpath: Path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "argosy", "serve", "--model", MODEL, "--port", str(port)]
    cmd += ["--speculative", "off", "--threads", "1"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, cwd=pythonpath)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"argosy serve from {pythonpath} exited {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _client(http: httpx.AsyncClient, url: str, i: int, stop: asyncio.Event, out: dict):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "max_tokens": 256,
        "temperature": 0,
        "stream": True,
    }
    while not stop.is_set():
        try:
            async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    out["errors"] += 1
                    await asyncio.sleep(0.5)
                    continue
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        out["chunks"] += 1
                    if stop.is_set():
                        break
        except httpx.HTTPError:
            out["errors"] += 1
            await asyncio.sleep(0.5)


async def _probe(url: str, seconds: float) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = defaultdict(list)
    failures: dict[str, int] = defaultdict(int)
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as http:
        end = time.perf_counter() + seconds
        turn = 0
        while time.perf_counter() < end:
            route = ROUTES[turn % len(ROUTES)]
            turn += 1
            start = time.perf_counter()
            try:
                status = (await http.get(f"{url}{route}")).status_code
            except httpx.HTTPError:
                status = 0
            took = time.perf_counter() - start
            if status == 404:  # the route does not exist on this peer (`before`: /live)
                continue
            ok = status == 200
            samples[route].append(min(took, PROBE_TIMEOUT_S) if ok else PROBE_TIMEOUT_S)
            failures[route] += not ok
            await asyncio.sleep(max(0.0, 0.05 - took))
    return {"samples": dict(samples), "failures": dict(failures)}


async def _load(url: str, clients: int, warmup_s: float, seconds: float) -> dict:
    stop = asyncio.Event()
    out = {"chunks": 0, "errors": 0}
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        tasks = [asyncio.create_task(_client(http, url, i, stop, out)) for i in range(clients)]
        await asyncio.sleep(warmup_s)
        before = out["chunks"]
        probed = await _probe(url, seconds)
        streamed = out["chunks"] - before
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {**probed, "chunks_per_s": streamed / seconds, "stream_errors": out["errors"]}


def _big_bodies(url: str, pid: int) -> dict:
    """Seconds to answer a 4 MB and a 10 MB prompt (a 400 or 413 on this server), a
    `/v1/models` probe during each, and the serving processes' RSS before and after."""
    from argosy.serving.memory import rss_bytes

    def rss() -> int:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return rss_bytes(pid) + sum(rss_bytes(int(c)) for c in children)

    out: dict = {"rss_before_mib": rss() / 2**20}
    for mb in (4, 10):
        body = {"model": MODEL, "prompt": "word " * (mb * 2**20 // 5), "max_tokens": 1}
        probe: dict = {}

        def models(probe: dict = probe) -> None:
            time.sleep(0.2)
            start = time.perf_counter()
            httpx.get(f"{url}/v1/models", timeout=60)
            probe["s"] = time.perf_counter() - start

        side = threading.Thread(target=models)
        side.start()
        start = time.perf_counter()
        try:
            status = httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code
        except httpx.HTTPError:
            status = 0
        out[f"{mb}mb"] = {"status": status, "seconds": time.perf_counter() - start}
        side.join()
        out[f"{mb}mb"]["models_probe_s"] = probe.get("s")
    time.sleep(2)
    out["rss_after_mib"] = rss() / 2**20
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _report(rows: dict[str, dict[int, dict]]) -> None:
    print(f"{'peer':8} {'N':>4} {'route':11} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'fail':>5} {'chunks/s':>9} {'errors':>6}")  # fmt: skip
    for peer, by_n in rows.items():
        for n, row in by_n.items():
            for route in ROUTES:
                got = row["samples"].get(route, [])
                p50, p99 = _quantile(got, 0.5) * 1e3, _quantile(got, 0.99) * 1e3
                print(f"{peer:8} {n:>4} {route:11} {p50:8.1f} {p99:8.1f} "
                      f"{max(got, default=float('nan')) * 1e3:8.1f} "
                      f"{row['failures'].get(route, 0):>5} {row['chunks_per_s']:9.1f} "
                      f"{row['stream_errors']:>6}")  # fmt: skip
    if "before" in rows and "argosy" in rows:
        print("\np99 ratio argosy / before (lower is better):")
        for n in rows["argosy"]:
            for route in ROUTES:
                new = _quantile(rows["argosy"][n]["samples"].get(route, []), 0.99)
                old = _quantile(rows["before"].get(n, {}).get("samples", {}).get(route, []), 0.99)
                print(f"  N={n:<4} {route:11} {new / old if old else float('nan'):.3f}")
    for n, row in rows.get("argosy", {}).items():
        p99 = _quantile(row["samples"].get("/health", []), 0.99) * 1e3
        verdict = "meets" if p99 < 50 else "misses"
        print(f"target /health p99 < 50 ms at N={n}: {p99:.1f} ms ({verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="64,128", help="comma-separated client counts")
    parser.add_argument("--seconds", type=float, default=30.0, help="probing time per run")
    parser.add_argument("--warmup", type=float, default=15.0, help="load before probing (s)")
    parser.add_argument("--base", default="348258f", help="commit of the `before` peer")
    parser.add_argument("--peers", default="before,argosy", help="comma-separated")
    parser.add_argument("--json", help="write the samples here")
    parser.add_argument("--big", action="store_true", help="also 4 and 10 MB prompts, RSS")
    args = parser.parse_args()
    paths = {"argosy": ROOT}
    if "before" in args.peers:
        paths["before"] = _extract(args.base)
    rows: dict[str, dict[int, dict]] = defaultdict(dict)
    big: dict[str, dict] = {}
    for peer in args.peers.split(","):
        with _server(paths[peer]) as (url, pid):
            if args.big:
                big[peer] = _big_bodies(url, pid)
                print(f"{peer} big prompts: {big[peer]}", flush=True)
            for n in (int(c) for c in args.clients.split(",")):
                rows[peer][n] = asyncio.run(_load(url, n, args.warmup, args.seconds))
                health = rows[peer][n]["samples"].get("/health", [])
                print(f"{peer} N={n}: /health median {statistics.median(health) * 1e3:.1f} ms",
                      flush=True)  # fmt: skip
    _report(rows)
    if "before" in paths:
        shutil.rmtree(paths["before"], ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"load": rows, "big": big}))


if __name__ == "__main__":
    main()
