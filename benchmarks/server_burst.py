"""The API during a burst of starts: the control loop's pass whole vs in parts, in one run.

    .venv/bin/python benchmarks/server_burst.py                  # about 1 minute
    .venv/bin/python benchmarks/server_burst.py --jobs 200 --start-ms 40

A real `argosy server` app under uvicorn (SQLite) with an executor whose `start` takes
`--start-ms` of the loop's thread, as a real start does (the local executor: a process,
a cgroup, and a job user's first start `useradd`: 20-40 ms measured on this host). Its one
node is cordoned while `--jobs` one-device jobs queue, then uncordoned: one scheduling
cycle decides every start. One client probes `GET /api/v1/health` back to back until the
last job started; the figures are the probe's latency (p50, p99, max) and the burst's
length. The peer is the same server with the pass taken whole (the loop before it paused
between parts: `PAUSE_AFTER_S` infinite). Rounds alternate the two.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))
from server_helpers import STEPS, WORKDIR, fast_config  # noqa: E402

from argosy.executors.base import LaunchRequest, NodeInfo  # noqa: E402
from argosy.executors.fake import FakeExecutor  # noqa: E402
from argosy.server import control  # noqa: E402
from argosy.server.app import create_app  # noqa: E402


class SlowStarts(FakeExecutor):
    def __init__(self, devices: int, start_s: float) -> None:
        super().__init__([NodeInfo("n0", "cpu", devices)])
        self.start_s = start_s

    def start(self, request: LaunchRequest) -> None:
        time.sleep(self.start_s)  # blocks the loop's thread, as a real start does
        super().start(request)


def one_round(jobs: int, start_s: float, whole: bool, port: int) -> dict[str, float]:
    control.PAUSE_AFTER_S = float("inf") if whole else 0.005
    with tempfile.TemporaryDirectory() as home:
        fake = SlowStarts(jobs, start_s)
        config = fast_config(Path(home), port=port)
        app = create_app(config, executor=fake)
        server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        token = (Path(home) / "admin.token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as c:
            c.post("/api/v1/nodes/n0/cordon").raise_for_status()
            body = {"name": "b", "script": STEPS, "workdir": WORKDIR}
            for _ in range(jobs):
                c.post("/api/v1/jobs", json=body).raise_for_status()
            began = time.monotonic()
            c.post("/api/v1/nodes/n0/uncordon").raise_for_status()
            latencies = []
            while len(fake.started) < jobs:
                t = time.perf_counter()
                c.get("/api/v1/health").raise_for_status()
                latencies.append(time.perf_counter() - t)
            burst = time.monotonic() - began
        server.should_exit = True
        thread.join(10)
    ms = sorted(x * 1e3 for x in latencies)
    return {
        "p50": statistics.median(ms),
        "p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "max": ms[-1],
        "probes": len(ms),
        "burst_s": burst,
    }


async def _free_port() -> int:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    return port


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--start-ms", type=float, default=25.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"whole": [], "parts": []}
    for r in range(args.rounds):
        for name in ("whole", "parts") if r % 2 == 0 else ("parts", "whole"):
            port = asyncio.run(_free_port())
            got = one_round(args.jobs, args.start_ms / 1e3, name == "whole", port)
            results[name].append(got)
            print(f"round {r + 1} {name:>5}: " + ", ".join(f"{k} {v:.1f}" for k, v in got.items()))
    print(f"\n{args.jobs} starts of {args.start_ms:g} ms each; medians over {args.rounds} rounds")
    print("| figure | pass whole | pass in parts | parts / whole |\n|---|---:|---:|---:|")
    for key in ("p50", "p99", "max", "probes", "burst_s"):
        whole = statistics.median(x[key] for x in results["whole"])
        parts = statistics.median(x[key] for x in results["parts"])
        unit = " s" if key == "burst_s" else ("" if key == "probes" else " ms")
        print(f"| GET /health {key}{unit} | {whole:.1f} | {parts:.1f} | {parts / whole:.2f} |")


if __name__ == "__main__":
    main()
