"""Tidal sharing live: a compressed day on a real control plane, with and without the lease.

    nice -n 10 python benchmarks/tidal.py                 # two days of 300 s each, ~12 min
    python benchmarks/tidal.py --period 150 --json out.json

Each day runs a real `argosy server` (local executor, two one-slot nodes) with the real
`argosy serve` (smollm2-135m) as a service and `examples/train_elastic.py` as a training
job, while a client sends a one-token chat request every `--request-every` seconds in
the peaks (the first fifth of the day, and the first seconds of the next day's peak):

  without   the service holds its device all day; the job trains on the other one.
  with      the service has a tidal forecast (peak in the first fifth of the period,
            awake again `--lead` seconds before the next peak); at the trough its replica
            sleeps, the job grows to 2 ranks through its checkpoint, and shrinks back
            before the peak, when the replica wakes.

It prints one table: yield (sleep) and reclaim (wake + first token) seconds, the job's
resize stop / restart / restore seconds, training steps and samples done over the day,
chat requests answered and refused (asleep) and their TTFT (a one-token answer's
latency) in the peak, and the ratio of samples with / without. Figures come from the
server's event log and the client's own clock.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from argosy.core.net import free_port

REPO = Path(__file__).resolve().parents[1]
STEP_S = 5.0
BATCH = 32
CONFIG = REPO / "examples" / "tidal_server.yaml"
CHAT = {"model": "smollm2-135m", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}


class Server:
    """`argosy server --config` on a free port with its own home."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.port = free_port()
        command = [sys.executable, "-m", "argosy", "server", "--port", str(self.port)]
        command += ["--home", str(self.home), "--slots", "2", "--config", str(CONFIG)]
        if os.geteuid() == 0:  # the lease reads run dirs under this home: jobs as root here
            command.append("--allow-root-jobs")
        log = (root / "server.log").open("ab")
        env = dict(os.environ, ARGOSY_HOME=str(self.home))  # its processes carry the home
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        token = (self.home / "admin.token").read_text().strip()
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"})

    def events(self, owner: str) -> list[dict[str, Any]]:
        path = "services" if owner.startswith("s") else "jobs"
        return self.client.get(f"/api/v1/{path}/{owner}/events", params={"limit": 500}).json()[
            "items"
        ]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        from argosy.executors.local import kill_leftovers

        kill_leftovers(self.home / "runs")  # replicas and jobs outlive their server


class Traffic(threading.Thread):
    """One-token chat requests every `every_s` seconds within the `windows` (the peaks of
    the forecast: the load the service exists for) to whatever endpoint is up."""

    def __init__(
        self, server: Server, sid: str, every_s: float, windows: list[tuple[float, float]]
    ) -> None:
        super().__init__(daemon=True)
        self.server, self.sid, self.every_s, self.windows = server, sid, every_s, windows
        self.results: list[tuple[float, str, float]] = []  # (wall, outcome, seconds)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            now = time.time()
            if not any(start <= now < end for start, end in self.windows):
                continue
            data = self.server.client.get(f"/api/v1/services/{self.sid}").json()
            urls = [r["url"] for r in data["replicas"] if r.get("url")]
            if not urls:
                self.results.append((time.time(), "no replica", 0.0))
                continue
            start = time.perf_counter()
            try:
                r = httpx.post(f"{urls[0]}/chat/completions", json=CHAT, timeout=30)
                outcome = "ok" if r.status_code == 200 else f"http {r.status_code}"
            except httpx.HTTPError as err:
                outcome = type(err).__name__
            self.results.append((time.time(), outcome, time.perf_counter() - start))


def run_day(tidal: bool, period_s: float, lead_s: float, every_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="argosy-tidal-") as tmp:
        server = Server(Path(tmp))
        try:
            return _day(server, tidal, period_s, lead_s, every_s)
        finally:
            server.stop()


def _day(server: Server, tidal: bool, period_s: float, lead_s: float, every_s: float) -> dict:
    t0 = math.ceil((time.time() + 1.0) / STEP_S) * STEP_S
    service: dict[str, Any] = {"name": "chat", "replicas": 1, "speculative": "off", "threads": 1}
    peak_steps = max(1, round(period_s / 5 / STEP_S))
    if tidal:
        levels = [1.0] * peak_steps + [0.0] * (round(period_s / STEP_S) - peak_steps)
        service["tidal"] = {
            "levels": levels,
            "period_s": period_s,
            "offset_s": t0 % period_s,
            "lead_s": lead_s,
            "sleep_level": 1,
        }
    sid = server.client.post("/api/v1/services", json=service).json()["id"]
    job: dict[str, Any] = {
        "name": "train",
        "script": str(REPO / "examples" / "train_elastic.py"),
        "args": ["--steps", "1000000", "--step-s", "0.2", "--ckpt-every", "20"],
        "workdir": str(REPO),
    }
    if tidal:
        job["elastic"] = {"min_nnodes": 1, "max_nnodes": 2}
    jid = server.client.post("/api/v1/jobs", json=job).json()["id"]
    end = t0 + period_s + 10.0  # the peak after the day, and a little of it
    peak_s = peak_steps * STEP_S
    traffic = Traffic(server, sid, every_s, [(t0, t0 + peak_s), (t0 + period_s, end)])
    traffic.start()
    while time.time() < end:
        time.sleep(1.0)
    traffic.done.set()
    traffic.join(timeout=40)
    steps = _steps(server.home / "runs" / jid, t0, t0 + period_s)
    return {
        "tidal": tidal,
        "t0": t0,
        "service_events": server.events(sid),
        "job_events": server.events(jid),
        "traffic": traffic.results,
        "peak_s": (t0, t0 + peak_s, t0 + period_s, end),
        **steps,
    }


STEP_LINE = re.compile(r"^step (\d+) loss \S+ world (\d+)$")


def _steps(run_dir: Path, start: float, end: float) -> dict[str, int]:
    """Steps and samples rank 0 logged within the day (every attempt's log)."""
    seen: dict[int, int] = {}
    for log in run_dir.glob("**/rank0.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = STEP_LINE.match(line.strip())
            if m:
                seen[int(m.group(1))] = int(m.group(2))
    events = []
    for path in run_dir.glob("**/events.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "step" and "step" in e:
                events.append((e["wall"], int(e["step"])))
    from datetime import datetime

    inside = {s for wall, s in events if start <= datetime.fromisoformat(wall).timestamp() < end}
    return {
        "steps": len(inside),
        "samples": sum(seen.get(s, 1) * BATCH for s in inside),
    }


def _seconds(events: list[dict], kind: str, pattern: str) -> list[float]:
    out = []
    for e in events:
        m = re.search(pattern, e["message"]) if e["kind"] == kind else None
        if m:
            out.append(float(m.group(1)))
    return out


def summarize(day: dict[str, Any]) -> dict[str, Any]:
    s_events, j_events = day["service_events"], day["job_events"]
    _, peak_end, next_peak, end = day["peak_s"]
    in_peak = [r for r in day["traffic"] if r[0] < peak_end or next_peak <= r[0] < end]
    ttft = sorted(s for _, outcome, s in in_peak if outcome == "ok")
    outcomes = [o for _, o, _ in day["traffic"]]
    resized = [e["message"] for e in j_events if e["kind"] == "resized"]
    return {
        "yield_s": _seconds(s_events, "yield", r"asleep in ([\d.]+) s"),
        "reclaim_s": _seconds(s_events, "reclaim", r"= ([\d.]+) s"),
        "wake_s": _seconds(s_events, "reclaim", r"wake ([\d.]+) s"),
        "resize_stop_s": _seconds(j_events, "resized", r"stop ([\d.]+) s"),
        "resize_restart_s": _seconds(j_events, "resized", r"restart ([\d.]+) s"),
        "resize_restore_s": _seconds(j_events, "resized", r"restore ([\d.]+) s"),
        "lost_steps": _seconds(j_events, "resized", r"(\d+) step\(s\) lost"),
        "resized": resized,
        "steps": day["steps"],
        "samples": day["samples"],
        "answered": outcomes.count("ok"),
        "refused": len(outcomes) - outcomes.count("ok"),
        "ttft_peak_p50_s": statistics.median(ttft) if ttft else float("nan"),
        "ttft_peak_max_s": max(ttft) if ttft else float("nan"),
        "reclaimed_before_peak": all(
            _created(e) < next_peak for e in s_events if e["kind"] == "reclaim"
        ),
    }


def _created(event: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["created_at"]).timestamp()


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) if values else "-"


def report(without: dict[str, Any], with_: dict[str, Any]) -> Table:
    table = Table(title="tidal sharing live: one compressed day, without and with the lease")
    table.add_column("measure")
    table.add_column("without lease", justify="right")
    table.add_column("with lease", justify="right")
    rows = [
        ("yield: sleep (s)", "yield_s"),
        ("reclaim: wake + first token (s)", "reclaim_s"),
        ("  of which wake (s)", "wake_s"),
        ("resize: stop until exit (s)", "resize_stop_s"),
        ("resize: relaunch until ranks attached (s)", "resize_restart_s"),
        ("resize: restore (s)", "resize_restore_s"),
        ("steps lost per resize", "lost_steps"),
    ]
    for label, key in rows:
        table.add_row(label, _fmt(without[key]), _fmt(with_[key]))
    table.add_row("training steps in the day", str(without["steps"]), str(with_["steps"]))
    table.add_row("training samples in the day", str(without["samples"]), str(with_["samples"]))
    ratio = with_["samples"] / without["samples"] if without["samples"] else float("nan")
    table.add_row("samples with / without", "", f"{ratio:.2f}x")
    table.add_row("chat requests answered", str(without["answered"]), str(with_["answered"]))
    table.add_row("refused (asleep, not up yet)", str(without["refused"]), str(with_["refused"]))
    for label, key in (("TTFT in the peaks, p50 (s)", "ttft_peak_p50_s"),
                       ("TTFT in the peaks, max (s)", "ttft_peak_max_s")):  # fmt: skip
        table.add_row(label, f"{without[key]:.2f}", f"{with_[key]:.2f}")
    table.add_row("reclaimed before the peak", "", str(with_["reclaimed_before_peak"]))
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--period", type=float, default=300.0, help="seconds of the compressed day")
    p.add_argument("--lead", type=float, default=25.0, help="lead_s of the tidal forecast")
    p.add_argument("--request-every", type=float, default=2.0, help="seconds between requests")
    p.add_argument("--json", type=Path, default=None, help="write both days' figures here")
    args = p.parse_args(argv)
    console = Console()
    days = {}
    for tidal in (False, True):
        console.print(f"day {'with' if tidal else 'without'} the lease ({args.period:g} s) ...")
        days[tidal] = summarize(run_day(tidal, args.period, args.lead, args.request_every))
    console.print(report(days[False], days[True]))
    for message in days[True]["resized"]:
        console.print(f"  resized: {message}", highlight=False)
    load = os.getloadavg()
    console.print(f"machine: {os.cpu_count()} cores, load {load[0]:.1f} / {load[1]:.1f} (1/5 min)")
    if args.json:
        args.json.write_text(json.dumps({"without": days[False], "with": days[True]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
