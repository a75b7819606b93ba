"""A private multi-raylet Ray cluster on this host for benchmarks/multinode.py.

A head without chips and `workers` raylets with `{"chip:cpu": 1}` each, labelled
`argosy.io/node=worker-<i>` (the stable node names of argosy's Ray executor; unlabelled
raylets sharing one IP are renamed when one of them dies), every one a
`ray start --block` process group with its own ports and one dedicated `--temp-dir`, so
it never touches another Ray cluster on the machine (no `ray stop`: that stops every
cluster of the user). A node dies as a machine would: SIGKILL to its raylet and every
process under it (Ray workers, launchers, training ranks). `stop()` ends what it started,
and any process left with the temp dir on its command line.

    with LocalCluster(log_dir, workers=2) as cluster:
        node = cluster.node_of(pid)          # the worker whose raylet runs `pid`
        cluster.kill(node); cluster.add_worker(label=node.label)   # its host returns
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from argosy.core.net import free_port

RAY = str(Path(sys.executable).parent / "ray")
FAST_HEALTH = {  # as tests/executors/ray_helpers.py: a dead node seen in seconds, not 30
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}
CHIPS = '{"chip:cpu": 1}'
OBJECT_STORE_BYTES = 100 << 20
STOP_GRACE_S = 8.0
LABEL = "argosy.io/node"


@dataclass
class RayNode:
    """One `ray start --block` process group."""

    name: str
    proc: subprocess.Popen
    label: str = ""
    """Its `argosy.io/node` label: the stable name argosy's Ray executor gives it."""
    node_id: str = ""
    killed_at: float | None = None
    tree: set[int] = field(default_factory=set)


class LocalCluster:
    """Head plus chip workers as killable process groups (see the module docstring)."""

    def __init__(self, log_dir: Path, workers: int = 2, fast_health: bool = True) -> None:
        self.log_dir = log_dir
        self.temp_dir = Path(tempfile.mkdtemp(prefix="amn-", dir="/tmp"))  # short: sockets
        self.env = dict(os.environ) | (FAST_HEALTH if fast_health else {})
        self.env.pop("RAY_ADDRESS", None)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[RayNode] = []
        self.workers = workers

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Head first, then the workers; returns when Ray lists them all alive."""
        head = ["--head", "--port", str(self.port), "--include-dashboard=false"]
        head += ["--ray-client-server-port", str(free_port()), "--num-cpus", "2"]
        self._launch("head", head)
        for _ in range(self.workers):
            self.add_worker()

    def add_worker(self, label: str = "", timeout_s: float = 120.0) -> RayNode:
        """A chip worker joins (`ray start --address`) under `label` (a new one when
        empty; a dead node's to stand for that host coming back); returns it once its
        raylet runs."""
        label = label or f"worker-{sum(n.name != 'head' for n in self.nodes)}"
        args = ["--address", self.address, "--num-cpus", "1", "--resources", CHIPS]
        args += ["--labels", f"{LABEL}={label}"]
        node = self._launch(f"worker{len(self.nodes)}", args, timeout_s)
        node.label = label
        return node

    def _launch(self, name: str, args: list[str], timeout_s: float = 120.0) -> RayNode:
        log = (self.log_dir / f"ray-{name}.log").open("ab")
        ports = ["--node-manager-port", "--object-manager-port", "--metrics-export-port"]
        ports += ["--dashboard-agent-listen-port", "--dashboard-agent-grpc-port"]
        ports += ["--runtime-env-agent-port"]
        command = [RAY, "start", "--block", "--disable-usage-stats", "--temp-dir"]
        command += [str(self.temp_dir), "--object-store-memory", str(OBJECT_STORE_BYTES)]
        for flag in ports:
            command += [flag, str(free_port())]
        proc = subprocess.Popen(
            [*command, *args], stdout=log, stderr=log, env=self.env, start_new_session=True
        )
        node = RayNode(name, proc)
        self.nodes.append(node)
        node.node_id = self._wait_raylet(node, timeout_s)
        return node

    def _wait_raylet(self, node: RayNode, timeout_s: float) -> str:
        """The node id of the raylet under `node`'s process, once it runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise RuntimeError(f"ray start of {node.name} exited ({self.log_dir})")
            for pid, node_id in raylet_node_ids().items():
                if descends(pid, node.proc.pid):
                    return node_id
            time.sleep(0.25)
        raise RuntimeError(f"the raylet of {node.name} did not start ({self.log_dir})")

    def wait_alive(self, node_ids: list[str], timeout_s: float = 90.0) -> None:
        """Connected as a driver: wait until Ray lists every node id alive."""
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            if set(node_ids) <= alive:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray never listed {set(node_ids) - alive} alive")
            time.sleep(0.2)

    def connect(self) -> None:
        """This process becomes a driver of the cluster (on the head's raylet)."""
        import ray

        ray.init(
            address=self.address,
            namespace="argosy-bench",
            log_to_driver=False,
            logging_level="WARNING",
            _temp_dir=str(self.temp_dir),
        )
        self.wait_alive([n.node_id for n in self.nodes])

    def chip_workers(self) -> list[RayNode]:
        return [n for n in self.nodes if n.name != "head" and n.killed_at is None]

    def node_of(self, pid: int) -> RayNode | None:
        """The live node whose process tree holds `pid`."""
        return next(
            (n for n in self.nodes if n.killed_at is None and descends(pid, n.proc.pid)), None
        )

    def kill(self, node: RayNode) -> float:
        """The node dies at once, as a machine does: every process under its `ray start`
        is frozen (SIGSTOP, so no agent's exit lets the raylet report its own death),
        then SIGKILLed; returns the wall-clock time of the kill."""
        node.killed_at = time.time()
        tree = {node.proc.pid}
        for _ in range(3):  # a fork in flight shows up on the next pass
            tree |= descendants(node.proc.pid)
            for pid in tree:
                _signal(pid, signal.SIGSTOP)
        node.tree = tree | descendants(node.proc.pid)
        for pid in node.tree:
            _signal(pid, signal.SIGKILL)
        node.proc.wait()
        return node.killed_at

    def stop(self, keep: bool = False) -> None:
        """SIGTERM every node's group at once, SIGKILL what remains after `STOP_GRACE_S`,
        then anything that still names the temp dir; the temp dir goes unless `keep`."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        trees = set().union(*(descendants(n.proc.pid) for n in self.nodes))
        for node in self.nodes:
            if node.proc.poll() is None:
                _killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for node in self.nodes:
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
        for pid in trees | set(naming(str(self.temp_dir))):
            _signal(pid, signal.SIGKILL)
        if not keep:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def descendants(root: int) -> set[int]:
    """Every process whose parent chain reaches `root` (not `root` itself)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def descends(pid: int, ancestor: int) -> bool:
    parents = _parents()
    while pid > 1:
        if pid == ancestor:
            return True
        pid = parents.get(pid, 0)
    return False


def naming(text: str) -> list[int]:
    """Pids (not this one) whose command line contains `text`."""
    out = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def raylet_node_ids() -> dict[int, str]:
    """pid -> node id of every raylet on this host (tests/executors/ray_helpers.py too)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"/raylet"):
            for a in args:
                if a.startswith(b"--node_id="):
                    out[int(entry.name)] = a.split(b"=", 1)[1].decode()
    return out


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
