"""The argosy peer of benchmarks/multinode.py: `argosy server --executor ray` on the
benchmark's cluster, a 2-node gang of examples/train_gpt.py that loses the node of its
rank 1, `/api/v1/health` sampled every 100 ms throughout, and a cancelled gang whose
placement group is timed until Ray no longer lists it.

    result = run_argosy(cluster, plan, work, say)   # a dict, as the JSON report holds it
"""

from __future__ import annotations

import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from multinode_cluster import LocalCluster, RayNode, naming
from multinode_fault import node_loss

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))
from server_helpers import ServerProcess  # noqa: E402

from argosy.checkpoint.disk import committed_steps  # noqa: E402
from argosy.executors.local import kill_job_processes  # noqa: E402
from argosy.server.state_dir import run_dir_of  # noqa: E402

TRAIN_GPT = ROOT / "examples" / "train_gpt.py"
TERMINAL = {"succeeded", "failed", "cancelled"}
STEP_LINE = re.compile(rb"^step (\d+) loss \S+ t ([\d.]+)$", re.M)
RESUMED = re.compile(rb"\[rank 0\] resumed from step (\d+)")
HEALTH_EVERY_S = 0.1


class HealthSampler(threading.Thread):
    """GET /api/v1/health every 100 ms (start to start) until `stop()`; a failed or
    timed-out call counts as its full wait."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.ms: list[float] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5.0) as c:
            while not self._halt.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.get("/api/v1/health").status_code == 200
                except httpx.HTTPError as err:
                    ok = False
                    self.errors.append(type(err).__name__)
                elapsed = time.perf_counter() - t0
                self.ms.append(elapsed * 1000)
                if not ok and len(self.errors) < len(self.ms):
                    self.errors.append("status")
                self._halt.wait(max(0.0, HEALTH_EVERY_S - elapsed))

    def stop(self) -> dict[str, Any]:
        self._halt.set()
        self.join(timeout=10)
        return summarize_ms(self.ms) | {"errors": len(self.errors)}


def summarize_ms(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"samples": 0}
    cuts = statistics.quantiles(ms, n=100) if len(ms) > 1 else [ms[0]] * 99
    return {"samples": len(ms), "p50_ms": cuts[49], "p99_ms": cuts[98], "max_ms": max(ms)}


class JobWatch(threading.Thread):
    """The job's state every 0.2 s: each change with its wall-clock time."""

    def __init__(self, client: httpx.Client, job_id: str) -> None:
        super().__init__(daemon=True)
        self.client, self.job_id = client, job_id
        self.changes: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                job = self.client.get(f"/api/v1/jobs/{self.job_id}").json()
            except (httpx.HTTPError, ValueError):  # the next poll tells
                job = self.last
            key = (job.get("state"), job.get("attempts"))
            if key != (self.last.get("state"), self.last.get("attempts")):
                self.changes.append({"t": time.time(), "state": key[0], "attempts": key[1]})
                self.changes[-1]["reason"] = job.get("reason")
            self.last = job
            self._halt.wait(0.2)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


class ArgosyProbe:
    """The gang's rank 0 log and checkpoint store, read from its run directory."""

    def __init__(self, watch: JobWatch, run_dir: Path) -> None:
        self.watch, self.run_dir = watch, run_dir
        self.seen: set[tuple[int, float]] = set()

    def _read(self) -> None:
        for log in self._logs():
            for m in STEP_LINE.finditer(_bytes(log)):
                self.seen.add((int(m.group(1)), float(m.group(2))))

    def _logs(self) -> list[Path]:
        """Rank 0's logs: the running attempt's, and earlier ones moved to history/."""
        older = self.run_dir.glob("history/*/logs/attempt*/rank0.log")
        return [*older, *self.run_dir.glob("logs/attempt*/rank0.log")]

    def steps(self) -> dict[int, float]:
        self._read()
        out: dict[int, float] = {}
        for step, t in sorted(self.seen, key=lambda x: x[1]):
            out.setdefault(step, t)
        return out

    def after(self, t: float) -> list[tuple[int, float]]:
        self._read()
        return sorted(((s, ts) for s, ts in self.seen if ts > t), key=lambda x: x[1])

    def committed(self) -> int | None:
        steps = committed_steps(self.run_dir / "checkpoints")
        return steps[-1] if steps else None

    def rank1_node(self, cluster: LocalCluster) -> RayNode | None:
        """The node whose process tree runs node rank 1's `argosy launch`."""
        needle = str(self.run_dir / "node1")
        for pid in naming(needle):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"launch" in args and b"--node-rank" in args:
                node = cluster.node_of(pid)
                if node is not None:
                    return node
        return None

    def resumed_from(self, after_t: float) -> int | None:
        logs = sorted((p for p in self._logs() if _mtime(p) > after_t), key=_mtime)
        found = [int(m.group(1)) for p in logs for m in RESUMED.finditer(_bytes(p))]
        return found[-1] if found else None

    def failed(self) -> str | None:
        state = self.watch.last.get("state")
        return f"job {state}: {self.watch.last.get('reason')}" if state in TERMINAL else None


def run_argosy(cluster: LocalCluster, plan: dict[str, Any], work: Path, say: Any) -> dict:
    """The whole argosy scenario (see the module docstring); never raises for a failed
    scenario: the error and the evidence are in the result."""
    home = work / "argosy-home"
    home.mkdir(parents=True)
    server = ServerProcess(home, "--executor", "ray", "--ray-address", cluster.address)
    out: dict[str, Any] = {"log_dir": str(work)}
    jobs: list[str] = []
    t0 = time.time()
    server.start(timeout_s=180)
    out["server_start_s"] = time.time() - t0
    health = HealthSampler(server.url)
    health.start()
    client = server.client()
    try:
        out |= _gang_with_node_loss(cluster, client, home, plan, jobs, say)
        say("argosy: cancel a running gang ...")
        out["cancel"] = _cancel(client, home, plan, jobs)
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
    finally:
        out["health"] = health.stop()
        out["events"] = _events(client)
        client.close()
        server.kill()
        for job_id in jobs:
            kill_job_processes(job_id)
    return out


def job_body(name: str, plan: dict[str, Any], steps: int) -> dict[str, Any]:
    args = ["--steps", steps, "--ckpt-every", plan["ckpt_every"]]
    args += ["--step-sleep", plan["step_sleep"]]
    return {
        "name": name,
        "script": str(TRAIN_GPT),
        "args": [str(a) for a in args],
        "workdir": str(ROOT),
        "nproc_per_node": 1,
        "nnodes": 2,
        "checkpoint_every": plan["ckpt_every"],
        "max_restarts": 3,
    }


def _gang_with_node_loss(
    cluster: LocalCluster,
    client: httpx.Client,
    home: Path,
    plan: dict[str, Any],
    jobs: list[str],
    say: Any,
) -> dict[str, Any]:
    r = client.post("/api/v1/jobs", json=job_body("multinode", plan, plan["steps"]))
    r.raise_for_status()
    job_id = r.json()["id"]
    jobs.append(job_id)
    say(f"argosy: job {job_id}, 2-node gang, {plan['steps']} steps")
    watch = JobWatch(client, job_id)
    watch.start()
    probe = ArgosyProbe(watch, run_dir_of(home, job_id))
    fault = node_loss(
        cluster, probe, plan["kill_step"], plan["rejoin_after_s"], plan["timeout_s"], say
    )
    final = _wait_state(client, job_id, TERMINAL, plan["timeout_s"])
    watch.stop()
    out = {"job_id": job_id, "fault": fault.as_dict(), "states": watch.changes}
    out["final"] = {k: final.get(k) for k in ("state", "attempts", "reason", "exit_code")}
    out["lost_s"] = _left_running_s(watch.changes, fault.kill_t)
    out["committed_after"] = probe.committed()
    return out


def _left_running_s(changes: list[dict[str, Any]], kill_t: float) -> float | None:
    """Seconds from the kill until the server saw the attempt end (state left running)."""
    after = [c for c in changes if c["t"] > kill_t and c["state"] != "running"]
    return after[0]["t"] - kill_t if after and kill_t else None


def _cancel(client: httpx.Client, home: Path, plan: dict[str, Any], jobs: list[str]) -> dict:
    """A second gang trains, is cancelled; seconds until Ray lists no group of it."""
    r = client.post("/api/v1/jobs", json=job_body("cancel-me", plan, 100_000))
    r.raise_for_status()
    job_id = r.json()["id"]
    jobs.append(job_id)
    watch = JobWatch(client, job_id)
    watch.start()
    probe = ArgosyProbe(watch, run_dir_of(home, job_id))
    deadline = time.monotonic() + plan["timeout_s"]
    while not (_groups(job_id) and probe.steps()):  # placed and training
        if time.monotonic() > deadline or probe.failed():
            raise RuntimeError(f"the job to cancel never trained: {watch.last}")
        time.sleep(0.1)
    t0 = time.time()
    client.post(f"/api/v1/jobs/{job_id}/cancel").raise_for_status()
    gone_t = cancelled_t = None
    while gone_t is None or cancelled_t is None:
        now = time.time()
        if gone_t is None and not _groups(job_id):
            gone_t = now
        if cancelled_t is None and client.get(f"/api/v1/jobs/{job_id}").json()["state"] in TERMINAL:
            cancelled_t = now
        if now - t0 > 120:
            raise RuntimeError(f"not freed 120 s after the cancel: {_groups(job_id)}")
        time.sleep(0.05)
    watch.stop()
    final = client.get(f"/api/v1/jobs/{job_id}").json()
    return {
        "job_id": job_id,
        "pg_gone_s": gone_t - t0,
        "state": final["state"],
        "ended_s": cancelled_t - t0,
        "steps_before": max(probe.steps(), default=0),
    }


def _groups(job_id: str) -> list[str]:
    """Names of the job's placement groups that Ray has not removed."""
    from ray.util import placement_group_table

    prefix = f"argosy-{job_id}-"
    return [
        p["name"]
        for p in placement_group_table().values()
        if p["name"].startswith(prefix) and p["state"] != "REMOVED"
    ]


def _wait_state(client: httpx.Client, job_id: str, states: set[str], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
        if job["state"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def _events(client: httpx.Client) -> list[dict[str, Any]]:
    try:
        items = client.get("/api/v1/events", params={"limit": 500}).json()["items"]
    except (httpx.HTTPError, KeyError, ValueError):
        return []
    return [{k: e.get(k) for k in ("created_at", "kind", "job_id", "message")} for e in items]


def _bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
