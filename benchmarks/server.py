"""Control-plane benchmark: submit throughput, API latency at 10,000 stored jobs, job start.

    .venv/bin/python benchmarks/server.py                 # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/server.py --jobs 2000     # a shorter run
    .venv/bin/python benchmarks/server.py --only service --services 3

Runs a real `argosy server` process (SQLite, local executor) and drives it over HTTP:

1. Throughput: `--clients` concurrent clients (asyncio tasks over a shared connection
   pool) submit until `--jobs` are stored; the node is cordoned, so jobs are stored and
   queued by the scheduler but not run. The peer is `GET /api/v1/health` driven the same
   way: the framework's floor on this machine; the ratio says how much of it submit keeps.
2. Latency: with the store filled to 10,000 jobs, one client times each endpoint in turn
   (p50 and p99 over `--samples` calls each).
3. Start: the node uncordoned, a one-rank CPU job is submitted; the figure is the time
   from the submit call to the script's first line. The peer is `argosy launch` of the
   same script run directly; the difference is what the server adds.

4. Services (`--services N`): a one-replica service from the create call to its first
   healthy probe, beside `argosy serve` started directly until `/health` answers.

Prints a table and the ratios to the issue's targets (200 jobs/s, p99 < 100 ms, start
< 2 s). The server's CPU seconds are read from /proc, because wall time on a shared
machine is distorted by load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))
from server_helpers import ServerProcess  # noqa: E402

STAMP = "import time, sys; print('started', time.time(), flush=True)\n"
TARGET_RATE, TARGET_P99_MS, TARGET_START_S = 200.0, 100.0, 2.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(url: str, token: str, total: int, clients: int, submit: bool) -> float:
    """Requests per second of `clients` concurrent keep-alive connections until `total`
    requests are answered. A bare HTTP/1.1 client over asyncio streams: on a 2-core
    machine the load generator shares the CPU with the server, and a full HTTP client
    library costs more per request than the server does."""
    host, port = url.removeprefix("http://").split(":")
    left = [total]

    def request(k: int) -> bytes:
        if not submit:
            head = f"GET /api/v1/health HTTP/1.1\r\nHost: {host}\r\n\r\n"
            return head.encode()
        job = {"name": f"b{k}", "script": "/bin/true", "args": [str(left[0])], "workdir": "/"}
        body = json.dumps(job)
        head = (
            f"POST /api/v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return (head + body).encode()

    async def client(k: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        want = b" 201 " if submit else b" 200 "
        while left[0] > 0:
            left[0] -= 1
            writer.write(request(k))
            head = await reader.readuntil(b"\r\n\r\n")
            assert want in head.split(b"\r\n", 1)[0], head[:200]
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return total / (time.perf_counter() - t0)


def latencies(
    c: httpx.Client, samples: int, job_ids: list[str], pid: int
) -> dict[str, tuple[float, float, float]]:
    """(p50 ms, p99 ms, server CPU ms per call) of each endpoint."""
    calls = {
        "GET /jobs?limit=100": lambda i: c.get("/api/v1/jobs", params={"limit": 100}),
        "GET /jobs?state&queue (page 50)": lambda i: c.get(
            "/api/v1/jobs",
            params={"state": "pending", "queue": "default", "limit": 100, "cursor": 5000},
        ),
        "GET /jobs/{id}": lambda i: c.get(f"/api/v1/jobs/{job_ids[i % len(job_ids)]}"),
        "POST /jobs": lambda i: c.post(
            "/api/v1/jobs",
            json={"name": "lat", "script": "/bin/true", "args": [str(i)], "workdir": "/"},
        ),
        "GET /queues": lambda i: c.get("/api/v1/queues"),
        "GET /nodes": lambda i: c.get("/api/v1/nodes"),
        "GET /metrics": lambda i: c.get("/metrics"),
    }
    out = {}
    for label, call in calls.items():
        times = []
        cpu0 = cpu_s(pid)
        for i in range(samples):
            t0 = time.perf_counter()
            r = call(i)
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code < 300, r.text
        cpu_ms = (cpu_s(pid) - cpu0) / samples * 1000
        times.sort()
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
        out[label] = (statistics.median(times), p99, cpu_ms)
    return out


def start_latency(c: httpx.Client, script: Path, home: Path, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.time()
        body = {"name": "start", "script": str(script), "workdir": str(script.parent)}
        job = c.post("/api/v1/jobs", json=body).json()
        log = home / "runs" / job["id"] / "logs" / "attempt0" / "rank0.log"
        deadline = time.monotonic() + 60
        while not (found := re.search(r"started (\d+\.\d+)\n", read(log))):
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.01)
        out.append(float(found.group(1)) - t0)
        while c.get(f"/api/v1/jobs/{job['id']}").json()["state"] not in {"succeeded", "failed"}:
            time.sleep(0.05)
    return out


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def launch_latency(script: Path, work: Path, repeats: int) -> list[float]:
    out = []
    for k in range(repeats):
        run = work / f"launch{k}"
        t0 = time.time()
        subprocess.run(
            [sys.executable, "-m", "argosy", "launch", "--quiet", "--nproc-per-node", "1",
             "--run-dir", str(run), str(script)],
            check=True, capture_output=True,
        )  # fmt: skip
        out.append(float((run / "logs" / "attempt0" / "rank0.log").read_text().split()[1]) - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10_000, help="jobs stored before latency")
    p.add_argument("--clients", type=int, default=1000, help="concurrent submitting clients")
    p.add_argument("--samples", type=int, default=200, help="calls per endpoint")
    p.add_argument("--starts", type=int, default=5, help="job starts timed")
    p.add_argument("--services", type=int, default=0, help="service starts timed (0: none)")
    p.add_argument("--only", choices=["load", "start", "service"], help="run one phase")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.only in (None, "load"):
            load_phase(args, work / "home")
        if args.only in (None, "start"):
            start_phase(args, work)
        if args.services and args.only in (None, "service"):
            service_phase(args, work)


def load_phase(args: argparse.Namespace, home: Path) -> None:
    """Throughput and latency on a server whose only node is cordoned (every job of
    `--jobs` waits in one queue: the per-queue limit of waiting jobs is lifted)."""
    unbounded = home.parent / "unbounded.yaml"
    unbounded.write_text("max_pending_jobs_per_queue: 0\n")
    server = ServerProcess(home, "--config", str(unbounded))
    server.start()
    pid = server.proc.pid
    token = (server.home / "admin.token").read_text().strip()
    with server.client() as c:
        node = c.get("/api/v1/nodes").json()[0]["name"]
        c.post(f"/api/v1/nodes/{node}/cordon")
        floor = asyncio.run(drive(server.url, token, 2000, args.clients, submit=False))
        cpu0 = cpu_s(pid)
        rate = asyncio.run(drive(server.url, token, args.jobs, args.clients, submit=True))
        cpu_per_job_ms = (cpu_s(pid) - cpu0) / args.jobs * 1000
        print(f"\nsubmit throughput ({args.clients} clients, {args.jobs} jobs, SQLite):")
        print(f"  submit       {rate:8.0f} jobs/s   ({rate / TARGET_RATE:.2f}x the 200/s target)")
        print(f"  GET /health  {floor:8.0f} req/s    (submit: {rate / floor:.2f}x this floor)")
        print(f"  server CPU per submit: {cpu_per_job_ms:.2f} ms", flush=True)
        ids = [j["id"] for j in c.get("/api/v1/jobs", params={"limit": 500}).json()["items"]]
        lat = latencies(c, args.samples, ids, pid)
    server.kill()
    print(f"\nAPI latency with {args.jobs}+ stored jobs, {args.samples} calls each:")
    print(f"  {'endpoint':34} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms':>8}")
    for label, (p50, p99, cpu_ms) in lat.items():
        print(f"  {label:34} {p50:8.1f} {p99:8.1f} {cpu_ms:8.2f}")
    worst = max(p99 for _, p99, _ in lat.values())
    print(
        f"  worst p99 {worst:.1f} ms ({worst / TARGET_P99_MS:.2f}x the 100 ms target)", flush=True
    )


def start_phase(args: argparse.Namespace, work: Path) -> None:
    """A CPU job's start on a fresh server with free slots, and argosy launch alone."""
    script = work / "stamp.py"
    script.write_text(STAMP)
    server = ServerProcess(work / "home-start")
    server.start()
    with server.client() as c:
        starts = start_latency(c, script, server.home, args.starts)
    server.kill()
    direct = launch_latency(script, work, args.starts)
    med, med_direct = statistics.median(starts), statistics.median(direct)
    print(f"\nCPU job start, submit -> script's first line ({args.starts} runs):")
    print(f"  via server     median {med:.2f} s, max {max(starts):.2f} s "
          f"({med / TARGET_START_S:.2f}x the 2 s target)")  # fmt: skip
    print(f"  argosy launch  median {med_direct:.2f} s (direct; the server adds "
          f"{med - med_direct:+.2f} s)")  # fmt: skip


def service_phase(args: argparse.Namespace, work: Path) -> None:
    """A one-replica service (smollm2-135m, from its local cache) from the create call to
    its first healthy probe, beside `argosy serve` started directly until /health answers."""
    server = ServerProcess(work / "home-service")
    server.start()
    via_server = []
    with server.client() as c:
        for k in range(args.services):
            t0 = time.time()
            body = {"name": f"s{k}", "replicas": 1, "speculative": "off", "threads": 1}
            sid = c.post("/api/v1/services", json=body).json()["id"]
            while c.get(f"/api/v1/services/{sid}").json()["state"] != "running":
                assert time.time() - t0 < 300, "the service did not become ready"
                time.sleep(0.05)
            via_server.append(time.time() - t0)
            c.delete(f"/api/v1/services/{sid}")
            while c.get(f"/api/v1/services/{sid}").json()["state"] != "deleted":
                time.sleep(0.1)
    server.kill()
    direct = [serve_alone(work, 18000 + k) for k in range(args.services)]
    med, med_direct = statistics.median(via_server), statistics.median(direct)
    print(f"\nservice ready, create -> replica healthy ({args.services} runs, smollm2-135m):")
    print(f"  via server     median {med:.2f} s, max {max(via_server):.2f} s")
    print(f"  argosy serve   median {med_direct:.2f} s (direct; the server adds "
          f"{med - med_direct:+.2f} s)")  # fmt: skip


def serve_alone(work: Path, port: int) -> float:
    command = [sys.executable, "-m", "argosy", "serve", "--port", str(port)]
    command += ["--speculative", "off", "--threads", "1"]
    t0 = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            assert proc.poll() is None and time.time() - t0 < 300, "argosy serve did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.time() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
