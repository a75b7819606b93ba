"""Sleep/wake of `argosy serve`: what memory stays, what sleep frees, wake to first token.

Starts `argosy serve` (and, with `--zygote`, a node zygote the service forks its worker
from), then per sleep level and repeat: reads each process's memory from /proc (RSS split
into anonymous, file-backed and shared; PSS; USS) awake and asleep, and times
`POST /admin/wake` until the first streamed line of a 1-token chat request. Peers side by
side in one run: worker started by spawn (a fresh Python) and by the zygote (a fork).

    nice -n 10 .venv/bin/python benchmarks/serving_sleep.py --repeats 3
    nice -n 10 .venv/bin/python benchmarks/serving_sleep.py --modes spawn --levels 1 --repeats 1

"Its CPU s" is the CPU time the HTTP process, the worker and the zygote used between the
wake call and the first token (on a shared, loaded machine the wall time is several times
that; the wake work runs on one thread, so its CPU time is about what it takes on an idle
core).
"Service" memory is the HTTP process plus its worker. The zygote is one process per node
shared by every service there; the tables report the freed fraction with it left out and
with it counted in full against this one service (by PSS: pages the worker shares with the
zygote are counted once, not twice as a sum of RSS would).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from argosy.core.net import free_port
from argosy.serving.memory import ProcessMemory, read_process_memory

MIB = 2**20
TOKEN = "bench"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHAT = {
    "model": "smollm2-135m",
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 1,
    "temperature": 0,
}


def start_zygote(socket_path: Path) -> subprocess.Popen[bytes]:
    """`argosy zygote` on `socket_path`, returned once it accepts connections."""
    cmd = [sys.executable, "-m", "argosy", "zygote", "--socket", str(socket_path)]
    cmd += ["--warm-model", "smollm2-135m"]
    zygote = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and not socket_path.exists():
        time.sleep(0.2)
    return zygote


def start_server(threads: int, zygote_socket: Path | None) -> tuple[subprocess.Popen[bytes], str]:
    """`argosy serve` with admin token `bench`: (process, base url) once it answers."""
    port = free_port()
    env = {**os.environ, "ARGOSY_ADMIN_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "argosy", "serve", "--port", str(port)]
    cmd += ["--speculative", "off", "--threads", str(threads)]
    if zygote_socket is not None:
        cmd += ["--zygote", str(zygote_socket)]
    server = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return server, base
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError("argosy serve did not become ready")


def service_memory(base: str) -> dict[str, ProcessMemory | None]:
    """Memory of the service's processes, by role (from the pids /admin/state reports)."""
    pids = httpx.get(f"{base}/admin/state", headers=AUTH, timeout=60).json()["pids"]
    return {role: read_process_memory(pid) if pid else None for role, pid in pids.items()}


def first_token_s(base: str) -> float:
    """Seconds from now until the first streamed line of a 1-token chat request."""
    start = time.perf_counter()
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=600
    ) as resp:
        next(resp.iter_lines())
    return time.perf_counter() - start


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds `pid` has used (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_cpu_s(base: str) -> float:
    """CPU seconds used so far by the HTTP process, the worker and the zygote (its forks)."""
    pids = httpx.get(f"{base}/admin/state", headers=AUTH, timeout=60).json()["pids"]
    return cpu_s(pids["http"]) + cpu_s(pids["worker"]) + cpu_s(pids["zygote"])


def one_cycle(base: str, level: int) -> dict[str, Any]:
    """Sleep at `level`, wake, first token: memory by process and the timings."""
    awake = service_memory(base)
    slept = httpx.post(f"{base}/admin/sleep", json={"level": level}, headers=AUTH, timeout=600)
    asleep = service_memory(base)
    cpu_before = service_cpu_s(base)
    start = time.perf_counter()
    woke = httpx.post(f"{base}/admin/wake", headers=AUTH, timeout=600).json()
    ttft = first_token_s(base)
    wall = time.perf_counter() - start
    return {
        "awake": awake,
        "asleep": asleep,
        "sleep_s": slept.json()["seconds"],
        "wake_s": woke["seconds"],
        "wake_to_first_token_s": wall,
        "first_token_s": ttft,
        "wake_to_first_token_cpu_s": service_cpu_s(base) - cpu_before,
    }


def total(memory: dict[str, ProcessMemory | None], field: str, roles: tuple[str, ...]) -> int:
    """Sum of one field over the processes of `roles` that exist."""
    return sum(getattr(m, field) for role, m in memory.items() if role in roles and m)


def freed(row: dict[str, Any], field: str, roles: tuple[str, ...]) -> float:
    """Fraction of `field` summed over `roles` that sleep gave back."""
    before, after = total(row["awake"], field, roles), total(row["asleep"], field, roles)
    return (before - after) / before if before else float("nan")


SERVICE = ("http", "worker")
WITH_ZYGOTE = ("http", "worker", "zygote")


def print_split(mode: str, level: int, row: dict[str, Any]) -> None:
    """Per-process memory awake and asleep (MiB)."""
    print(f"\n{mode}, level {level}: memory by process, MiB (awake -> asleep)")
    print("| process | RSS | anon | file | shmem | PSS | USS |")
    print("|---|---|---|---|---|---|---|")
    for role in ("http", "worker", "zygote"):
        before, after = row["awake"].get(role), row["asleep"].get(role)
        if before is None and after is None:
            continue
        cells = [
            f"{_mib(before, f)} -> {_mib(after, f)}"
            for f in ("rss_bytes", "anon_bytes", "file_bytes", "shmem_bytes", "pss_bytes")
        ]
        cells.append(f"{_mib(before, 'uss_bytes')} -> {_mib(after, 'uss_bytes')}")
        print(f"| {role} | " + " | ".join(cells) + " |")


def _mib(memory: ProcessMemory | None, field: str) -> str:
    return f"{getattr(memory, field) / MIB:.0f}" if memory is not None else "-"


def summarize(rows: dict[tuple[str, int], list[dict[str, Any]]]) -> None:
    """One line per mode and level: medians over repeats."""
    print("\nsleep/wake, medians over repeats (service = HTTP process + worker)")
    print(
        "| worker start | level | repeats | service RSS awake MiB | asleep MiB | freed (RSS) "
        "| freed (PSS) | freed (PSS), zygote counted | sleep s | wake s | wake to first token s "
        "| its CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (mode, level), cycles in rows.items():

        def med(key: str, cycles: list[dict[str, Any]] = cycles) -> float:
            return statistics.median(c[key] for c in cycles)

        awake = statistics.median(total(c["awake"], "rss_bytes", SERVICE) for c in cycles)
        asleep = statistics.median(total(c["asleep"], "rss_bytes", SERVICE) for c in cycles)
        rss = statistics.median(freed(c, "rss_bytes", SERVICE) for c in cycles)
        pss = statistics.median(freed(c, "pss_bytes", SERVICE) for c in cycles)
        counted = statistics.median(freed(c, "pss_bytes", WITH_ZYGOTE) for c in cycles)
        print(
            f"| {mode} | {level} | {len(cycles)} | {awake / MIB:.0f} | {asleep / MIB:.0f} "
            f"| {rss:.0%} | {pss:.0%} | {counted:.0%} | {med('sleep_s'):.2f} "
            f"| {med('wake_s'):.2f} | {med('wake_to_first_token_s'):.2f} "
            f"| {med('wake_to_first_token_cpu_s'):.2f} |"
        )


def run_mode(mode: str, levels: list[int], repeats: int, threads: int) -> dict[Any, Any]:
    """All cycles of one worker-start mode (`spawn` or `zygote`)."""
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="argosy-zygote-") as tmp:
        zygote_socket = Path(tmp) / "zygote.sock" if mode == "zygote" else None
        zygote = start_zygote(zygote_socket) if zygote_socket else None
        server, base = start_server(threads, zygote_socket)
        try:
            httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=600)  # warm-up
            for level in levels:
                for rep in range(repeats):
                    row = one_cycle(base, level)
                    rows.setdefault((mode, level), []).append(row)
                    if rep == 0:
                        print_split(mode, level, row)
                    print(
                        f"{mode} level {level} repeat {rep}: wake {row['wake_s']:.2f} s, "
                        f"wake to first token {row['wake_to_first_token_s']:.2f} s "
                        f"({row['wake_to_first_token_cpu_s']:.2f} s CPU), "
                        f"service RSS freed {freed(row, 'rss_bytes', SERVICE):.0%}",
                        flush=True,
                    )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
            if zygote is not None:
                zygote.send_signal(signal.SIGTERM)
                zygote.wait(timeout=60)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", default="1,2", help="comma-separated sleep levels")
    parser.add_argument("--modes", default="spawn,zygote", help="spawn, zygote or both")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the worker")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    levels = [int(level) for level in args.levels.split(",")]
    rows: dict[Any, Any] = {}
    for mode in args.modes.split(","):
        rows |= run_mode(mode, levels, args.repeats, args.threads)
    summarize(rows)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
