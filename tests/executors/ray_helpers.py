"""A real two-node Ray cluster on this machine: `ray start` head and worker processes, each
with two `chip:cpu` devices and its argosy node name as the Ray label `argosy.io/node`
(`head`, `worker`, and `late` for a node that joins later), started once per test module.
It runs with Ray's token authentication, as a cluster that runs tenants' jobs must (this
process, a client of it, gets the token in its environment)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from multinode_cluster import raylet_node_ids  # noqa: E402  (one /proc scan for both)

from argosy.core.net import free_port

RAY = str(Path(sys.executable).parent / "ray")
FAST_HEALTH = {  # detect a dead node in a few seconds, not thirty
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}

TOKEN_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
"""The cluster's token authentication. This process is a client of it too (the servers
the tests start in it): conftest.py puts the same in its environment at import, before
anything imports Ray, which reads its mode once."""


class RayCluster:
    """Head and worker as `ray start --block` process groups (killable one by one)."""

    def __init__(self, log_dir: Path, *, token: bool = True, head_only: bool = False) -> None:
        """With `token` False, a cluster that lets any client in; with `head_only`, its
        head alone, and this process does not connect to it."""
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_dir = log_dir
        env = {k: v for k, v in os.environ.items() if token or not k.startswith("RAY_AUTH")}
        self.env = env | FAST_HEALTH | (TOKEN_AUTH if token else {})
        self.head = self._start(
            "head", "--head", "--port", str(self.port), "--include-dashboard=false"
        )
        self._wait_nodes(1)
        self.worker: subprocess.Popen | None = None
        if head_only:
            return
        self.worker = self._start("worker", "--address", self.address)
        self._wait_nodes(2)
        self._wait_registered(2)

    def _wait_registered(self, n: int, timeout_s: float = 90.0) -> None:
        """Connect this process as the driver and wait until Ray lists `n` chip nodes."""
        import ray

        ray.init(
            address=self.address, namespace="argosy", log_to_driver=False, logging_level="WARNING"
        )
        deadline = time.monotonic() + timeout_s
        while sum(1 for x in ray.nodes() if x["Alive"] and "chip:cpu" in x["Resources"]) < n:
            assert time.monotonic() < deadline, "ray nodes did not register"
            time.sleep(0.25)

    def _start(self, name: str, *args: str, label: str = "") -> subprocess.Popen:
        """`ray start` of the node `name` (also its `argosy.io/node` label unless `label`)."""
        log = (self.log_dir / f"ray-{name}.log").open("ab")
        command = [
            RAY,
            "start",
            "--block",
            "--num-cpus",
            "1",
            "--disable-usage-stats",
            "--resources",
            '{"chip:cpu": 2}',
            "--labels",
            f"argosy.io/node={label or name}",
            *args,
        ]
        return subprocess.Popen(
            command, stdout=log, stderr=log, env=self.env, start_new_session=True
        )

    def _wait_nodes(self, n: int, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self._raylets()) < n:
            assert time.monotonic() < deadline, "ray nodes did not come up"
            time.sleep(0.25)

    def _raylets(self) -> dict[int, str]:
        """pid -> node id of this cluster's raylets (another test module's cluster may
        run on this host at the same time, under pytest -n)."""
        roots = [p.pid for p in (self.head, getattr(self, "worker", None),
                                 getattr(self, "late", None)) if p is not None]  # fmt: skip
        return {
            pid: nid
            for pid, nid in raylet_node_ids().items()
            if any(_descends(pid, root) for root in roots)
        }

    def worker_node_id(self) -> str:
        """The node id of the worker's raylet (a descendant of the worker process)."""
        return next(
            nid for pid, nid in raylet_node_ids().items() if _descends(pid, self.worker.pid)
        )

    def add_worker(self) -> str:
        """A node joins the running cluster (`ray start --address`); returns its node id."""
        before = set(self._raylets().values())
        self.late = self._start("late-worker", "--address", self.address, label="late")
        self._wait_nodes(len(before) + 1)
        return next(n for n in self._raylets().values() if n not in before)

    def kill_worker(self) -> None:
        """The worker node dies: SIGKILL to its whole process group."""
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait()

    def kill_late(self) -> None:
        """The node that joined later (`add_worker`) dies the same way."""
        os.killpg(self.late.pid, signal.SIGKILL)
        self.late.wait()

    def restart_worker(self) -> str:
        """The dead worker's host starts its raylet again (same label, new node id);
        returns the new node id."""
        before = set(self._raylets().values())
        self.worker = self._start("worker", "--address", self.address)
        self._wait_nodes(len(before) + 1)
        return next(n for n in self._raylets().values() if n not in before)

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM to each node's process group, then SIGKILL after `grace_s`: a worker
        stops in under a second, while a head's GCS and raylet outlast SIGTERM (measured:
        still up after 20 s), so waiting longer only delays the same SIGKILL."""
        for proc in (getattr(self, "late", None), self.worker, self.head):
            if proc is None:
                continue
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False
