"""Soak under `argosy server`: N streaming clients against one replica of an inference
service for D seconds, counting the replica restarts the control plane made (issue 35:
"0 replica restarts in a 10-minute 128-client run under `argosy server`").

    nice -n 10 .venv/bin/python benchmarks/serving_soak.py                 # 128 clients, 600 s
    .venv/bin/python benchmarks/serving_soak.py --clients 16 --seconds 60   # smoke run
    .venv/bin/python benchmarks/serving_soak.py --json soak.json --speculative off --threads 1

What it runs, all real processes on this machine:
1. `argosy server` (local executor) on a free port with its own temporary `ARGOSY_HOME`
   (`--allow-root-jobs` when run as root, as the server tests do); the admin token is
   read from `<home>/admin.token`. `ARGOSY_CACHE_DIR` is passed on (default
   `~/.cache/argosy`) so the replica loads the converted smollm2-135m from that cache.
2. One service through `POST /api/v1/services`: smollm2-135m, one replica (a CPU slot),
   `--speculative` and `--threads` as given (default: the service spec's own defaults,
   `auto` and 0). It waits until the service is `running` (its replica answered `/live`).
3. N clients (asyncio + httpx in this process) each loop on `POST /v1/chat/completions`
   with `stream: true`, `stream_options.include_usage`, a short prompt and `max_tokens`
   32, for D seconds; one thread per route probes the replica's `/health` and `/live`
   every second with a fresh connection, as the control plane does (timeout 5 s; the
   control plane's own timeout is 2 s, so probes slower than that are counted too).
4. At the end it reads the service from the server: each replica's `restarts` and
   `attempt`, and its event log (`replica_exited`, `replica_unhealthy`: 3 failed
   probes in a row, `replica_failed`). Single failed probes of the control plane are
   not recorded anywhere the API shows; the `/live` probes over 2 s stand in for them.

It prints clients, duration, completed requests, tokens/s (completion tokens of the
completed requests, from their usage chunks, over the duration), `/health` and `/live`
p50/p99/max, client errors by kind and the replica restarts (target 0). Whatever it
started (server, replica, clients, probers) is stopped on exit, Ctrl-C and SIGTERM
included: the service is deleted, the server stopped, and any replica process left is
killed by its job id. The machine is a shared 2-core VM: read medians, not single runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from argosy.core.net import free_port
from argosy.executors.local import kill_job_processes

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
PROBE_ROUTES = ("/health", "/live")
PROBE_TIMEOUT_S = 5.0
CONTROL_PROBE_TIMEOUT_S = 2.0
"""The control plane's probe timeout (argosy/server/services.py)."""
PROMPTS = [
    "Say hello in one sentence.",
    "Name three colours.",
    "What is two plus two?",
    "Give me a short tip for sleeping well.",
    "Write one line about the sea.",
    "Name a fruit and its colour.",
]


# ---- the control plane ------------------------------------------------------------------
def _server_env(home: Path) -> dict[str, str]:
    cache = os.environ.get("ARGOSY_CACHE_DIR") or str(Path.home() / ".cache" / "argosy")
    return {**os.environ, "ARGOSY_HOME": str(home), "ARGOSY_CACHE_DIR": cache}


def _start_server(home: Path, port: int) -> subprocess.Popen:
    """`argosy server` in its own session (Ctrl-C reaches only this script, which then
    stops everything in order)."""
    command = [sys.executable, "-m", "argosy", "server", "--port", str(port)]
    command += ["--home", str(home), "--executor", "local"]
    command += ["--allow-root-jobs"] if os.geteuid() == 0 else []
    log = (home.parent / "server.log").open("ab")
    return subprocess.Popen(
        command, stdout=log, stderr=log, env=_server_env(home), cwd=ROOT, start_new_session=True
    )


def _wait_server(url: str, proc: subprocess.Popen, home: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"argosy server exited {proc.returncode} at start")
        with contextlib.suppress(httpx.HTTPError):
            ok = httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200
            if ok and (home / "admin.token").exists():
                return
        time.sleep(0.2)
    raise RuntimeError("argosy server did not answer /api/v1/health")


def _admin(url: str, home: Path) -> httpx.Client:
    token = (home / "admin.token").read_text().strip()
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _create_service(admin: httpx.Client, speculative: str, threads: int) -> str:
    body = {"name": "soak", "model": MODEL, "replicas": 1}
    body |= {"speculative": speculative, "threads": threads}
    resp = admin.post("/api/v1/services", json=body)
    resp.raise_for_status()
    return resp.json()["id"]


def _wait_ready(admin: httpx.Client, sid: str, timeout_s: float) -> str:
    """The replica's base URL once the service is running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = admin.get(f"/api/v1/services/{sid}").json()
        if data["state"] == "running" and data["endpoints"]:
            return data["endpoints"][0].removesuffix("/v1")
        if data["state"] in ("failed", "deleted"):
            raise RuntimeError(f"service {sid} {data['state']}: {data.get('reason')}")
        time.sleep(0.5)
    raise RuntimeError(f"service {sid} not running after {timeout_s:.0f} s")


def _delete_service(admin: httpx.Client, sid: str, timeout_s: float = 60.0) -> None:
    with contextlib.suppress(httpx.HTTPError):
        admin.delete(f"/api/v1/services/{sid}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if admin.get(f"/api/v1/services/{sid}").json()["state"] in ("deleted", "failed"):
                return
            time.sleep(0.5)


def _stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _kill_replicas(home: Path) -> None:
    """Replica processes outlive their server: kill any left, by their job id."""
    for replica in (home / "runs").glob("s*/r*"):
        kill_job_processes(f"{replica.parent.name}.{replica.name}")


@contextlib.contextmanager
def _service(args: argparse.Namespace) -> Iterator[tuple[httpx.Client, str, str]]:
    """A running `argosy server` with one ready replica: (admin client, service id,
    replica URL); everything is stopped on the way out, whatever happened."""
    top = Path(tempfile.mkdtemp(prefix="argosy-soak-"))
    home, port = top / "home", free_port()
    home.mkdir()
    url = f"http://127.0.0.1:{port}"
    proc, admin, sid = _start_server(home, port), None, ""
    try:
        _wait_server(url, proc, home, timeout_s=180)
        admin = _admin(url, home)
        sid = _create_service(admin, args.speculative, args.threads)
        started = time.monotonic()
        replica = _wait_ready(admin, sid, timeout_s=args.ready_timeout)
        print(f"service {sid} ready in {time.monotonic() - started:.1f} s at {replica}", flush=True)
        yield admin, sid, replica
    except Exception:
        _print_tail(top / "server.log", "server log")
        for output in sorted((home / "runs").glob("s*/r*/server/attempt*/output.log")):
            _print_tail(output, f"replica output {output.relative_to(home)}")
        raise
    finally:
        if admin is not None and sid:
            _delete_service(admin, sid)
        _stop_server(proc)
        _kill_replicas(home)
        if admin is not None:
            admin.close()
        if not args.keep_home:
            shutil.rmtree(top, ignore_errors=True)
        else:
            print(f"kept {top}")


def _print_tail(path: Path, what: str, lines: int = 30) -> None:
    with contextlib.suppress(OSError):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        print(f"---- {what} (last {len(tail)} lines)\n" + "\n".join(tail), file=sys.stderr)


def _events(admin: httpx.Client, sid: str) -> list[dict]:
    items, cursor = [], None
    while True:
        params = {"limit": 500} | ({"cursor": cursor} if cursor is not None else {})
        page = admin.get(f"/api/v1/services/{sid}/events", params=params).json()
        items += page["items"]
        cursor = page.get("next_cursor")
        if cursor is None:
            return items


def _control_view(admin: httpx.Client, sid: str) -> dict:
    """What the control plane recorded: state, replica restarts, events by kind."""
    data = admin.get(f"/api/v1/services/{sid}").json()
    events = _events(admin, sid)
    kinds = Counter(e["kind"] for e in events)
    quiet = ("submitted", "replica_started", "replica_ready")
    return {
        "state": data["state"],
        "replicas": [
            {k: r.get(k) for k in ("index", "state", "attempt", "restarts")}
            for r in data["replicas"]
        ],
        "restarts": sum(r["restarts"] for r in data["replicas"]),
        "events": dict(kinds),
        "event_log": [f"{e['kind']}: {e['message']}" for e in events if e["kind"] not in quiet],
    }


# ---- probes -------------------------------------------------------------------------------
@dataclass
class Probes:
    """Seconds of each answered probe of one route, and failures by kind."""

    route: str
    seconds: list[float] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)


def _probe_once(url: str) -> tuple[float, str]:
    """(seconds, "" or the failure) of one GET on a fresh connection, made the way the
    control plane makes its probes (urllib; httpx would build an SSL context each time)."""
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310
            response.read()
            failure = "" if response.status == 200 else f"http {response.status}"
    except urllib.error.HTTPError as exc:
        failure = f"http {exc.code}"
    except (OSError, urllib.error.URLError) as exc:
        failure = type(getattr(exc, "reason", exc)).__name__
    return time.perf_counter() - start, failure


def _prober(base: str, probes: Probes, halt: threading.Event, interval_s: float) -> None:
    next_at = time.monotonic()
    while not halt.is_set():
        took, failure = _probe_once(base + probes.route)
        probes.seconds.append(took)
        if failure:
            probes.failures[failure] += 1
        next_at = max(next_at + interval_s, time.monotonic())
        halt.wait(next_at - time.monotonic())


@contextlib.contextmanager
def _probing(base: str, interval_s: float) -> Iterator[dict[str, Probes]]:
    halt = threading.Event()
    out = {route: Probes(route) for route in PROBE_ROUTES}
    threads = [
        threading.Thread(target=_prober, args=(base, p, halt, interval_s), daemon=True)
        for p in out.values()
    ]
    for thread in threads:
        thread.start()
    try:
        yield out
    finally:
        halt.set()
        for thread in threads:
            thread.join(timeout=PROBE_TIMEOUT_S + 1)


# ---- clients --------------------------------------------------------------------------------
@dataclass
class Tally:
    completed: int = 0
    tokens: int = 0
    errors: Counter = field(default_factory=Counter)


def _body(i: int, max_tokens: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _read_stream(resp: httpx.Response) -> tuple[int, str]:
    """(completion tokens, "" or the failure) of one SSE stream."""
    tokens, chunks = None, 0
    async for line in resp.aiter_lines():
        if line == "data: [DONE]":
            return (tokens if tokens is not None else chunks), ""
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if "error" in event:
            return 0, f"sse error {event['error'].get('type', '?')}"
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        chunks += any(c.get("delta", {}).get("content") for c in event.get("choices", []))
    return 0, "stream ended without [DONE]"


async def _one_request(http: httpx.AsyncClient, url: str, body: dict, tally: Tally) -> str:
    try:
        async with http.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return f"http {resp.status_code}"
            tokens, failure = await _read_stream(resp)
    except httpx.HTTPError as exc:
        return type(exc).__name__
    except json.JSONDecodeError:
        return "bad SSE json"
    if not failure:
        tally.completed += 1
        tally.tokens += tokens
    return failure


async def _client(http: httpx.AsyncClient, base: str, i: int, end: float, args, tally) -> None:
    url, body = f"{base}/v1/chat/completions", _body(i, args.max_tokens)
    while time.monotonic() < end:
        failure = await _one_request(http, url, body, tally)
        if failure:
            tally.errors[failure] += 1
            await asyncio.sleep(1.0)


async def _progress(admin_url: str, token: str, sid: str, tally: Tally, started: float) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=admin_url, headers=headers, timeout=10) as http:
        while True:
            await asyncio.sleep(60)
            try:
                data = (await http.get(f"/api/v1/services/{sid}")).json()
                restarts = sum(r["restarts"] for r in data["replicas"])
            except httpx.HTTPError as exc:
                restarts = f"? ({type(exc).__name__})"
            elapsed = time.monotonic() - started
            rate = tally.tokens / elapsed
            print(f"  {elapsed:5.0f} s: {tally.completed} done, {rate:.1f} tok/s, "
                  f"errors {dict(tally.errors)}, restarts {restarts}", flush=True)  # fmt: skip


async def _drive(base: str, args: argparse.Namespace, admin: httpx.Client, sid: str) -> Tally:
    tally, started = Tally(), time.monotonic()
    end = started + args.seconds
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients)
    token = admin.headers["Authorization"].removeprefix("Bearer ")
    progress = asyncio.create_task(_progress(str(admin.base_url), token, sid, tally, started))
    key = admin.get(f"/api/v1/services/{sid}/key").json()["api_key"]  # the service's /v1
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=args.request_timeout, limits=limits, headers=auth) as http:
        tasks = [
            asyncio.create_task(_client(http, base, i, end, args, tally))
            for i in range(args.clients)
        ]
        try:
            await asyncio.wait(tasks, timeout=args.seconds)
        finally:
            progress.cancel()
            for task in tasks:
                task.cancel()  # requests still in flight at the end are not counted
            await asyncio.gather(progress, *tasks, return_exceptions=True)
    return tally


# ---- report ---------------------------------------------------------------------------------
def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _longest_run(values: list[float], over_s: float) -> int:
    run = best = 0
    for value in values:
        run = run + 1 if value > over_s else 0
        best = max(best, run)
    return best


def _probe_rows(probes: dict[str, Probes]) -> dict[str, dict]:
    rows = {}
    for route, p in probes.items():
        rows[route] = {
            "n": len(p.seconds),
            "p50_ms": _quantile(p.seconds, 0.5) * 1e3,
            "p99_ms": _quantile(p.seconds, 0.99) * 1e3,
            "max_ms": max(p.seconds, default=float("nan")) * 1e3,
            "failures": dict(p.failures),
            "over_2s": sum(s > CONTROL_PROBE_TIMEOUT_S for s in p.seconds),
            "longest_run_over_2s": _longest_run(p.seconds, CONTROL_PROBE_TIMEOUT_S),
        }
    return rows


def _report(args: argparse.Namespace, tally: Tally, probes: dict, control: dict) -> None:
    print(f"\nclients {args.clients}, duration {args.seconds:.0f} s, max_tokens "
          f"{args.max_tokens}, speculative {args.speculative}, threads {args.threads}")  # fmt: skip
    print(f"completed requests {tally.completed}, completion tokens {tally.tokens}, "
          f"{tally.tokens / args.seconds:.1f} tokens/s, "
          f"{tally.completed / args.seconds:.2f} requests/s")  # fmt: skip
    print(f"client errors by kind: {dict(tally.errors) or 'none'}")
    print(f"{'route':8} {'probes':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>2 s':>5} "
          f"{'run>2s':>6}  failures")  # fmt: skip
    for route, row in probes.items():
        print(f"{route:8} {row['n']:>6} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} "
              f"{row['max_ms']:8.1f} {row['over_2s']:>5} {row['longest_run_over_2s']:>6}  "
              f"{row['failures'] or 'none'}")  # fmt: skip
    print(f"control plane: service {control['state']}, replicas {control['replicas']}")
    print(f"control plane events: {control['events']}")
    for line in control["event_log"]:
        print(f"  {line}")
    verdict = "meets" if control["restarts"] == 0 else "misses"
    print(f"replica restarts: {control['restarts']} (target 0: {verdict})")


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=128, help="streaming clients")
    parser.add_argument("--seconds", type=float, default=600.0, help="duration of the load")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request")
    parser.add_argument("--speculative", default="auto", help="the service's speculative")
    parser.add_argument("--threads", type=int, default=0, help="the service's threads")
    parser.add_argument("--probe-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="client, s")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="replica start, s")
    parser.add_argument("--keep-home", action="store_true", help="keep the server's home")
    parser.add_argument("--json", help="write the figures here")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    _sigterm_as_interrupt()
    with _service(args) as (admin, sid, replica):
        with _probing(replica, args.probe_interval) as probes:
            tally = asyncio.run(_drive(replica, args, admin, sid))
        control = _control_view(admin, sid)
    rows = _probe_rows(probes)
    _report(args, tally, rows, control)
    if args.json:
        figures = {"args": vars(args), "completed": tally.completed, "tokens": tally.tokens}
        figures |= {"errors": dict(tally.errors), "probes": rows, "control": control}
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
