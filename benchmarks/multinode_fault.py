"""One node loss, measured the same way for every peer of benchmarks/multinode.py.

A peer is watched through a `Probe`: the steps its rank 0 logged (step, wall-clock time),
its newest committed checkpoint, which node hosts its rank 1, and the step its next
attempt resumed from. `node_loss` waits for `kill_step`, SIGKILLs the node hosting rank 1
(raylet, Ray workers, ranks), watches Ray declare it dead, starts a replacement node
`rejoin_after_s` later, and waits for the first step trained after the kill.

    fault = node_loss(cluster, probe, kill_step=123, rejoin_after_s=20, timeout_s=240)
    fault.steps_lost, fault.resume_s
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from multinode_cluster import LocalCluster, RayNode

SETTLE_S = 0.5
"""A step rank 0 logs within this long of the kill belongs to the killed attempt (no new
attempt starts that fast: its node joins `rejoin_after_s` later)."""


class Probe(Protocol):
    """What a peer shows of its training (read from its logs, never from its state)."""

    def steps(self) -> dict[int, float]:
        """Step -> wall-clock time rank 0 logged it (the latest time for a redone step
        is kept apart: see `after`)."""

    def after(self, t: float) -> list[tuple[int, float]]:
        """(step, time) logged after wall-clock time `t`, oldest first."""

    def committed(self) -> int | None:
        """The newest checkpoint step that a restart could resume from now."""

    def rank1_node(self, cluster: LocalCluster) -> RayNode | None:
        """The live node that hosts global rank 1."""

    def resumed_from(self, after_t: float) -> int | None:
        """The step the first attempt started after `after_t` resumed from, as it said."""

    def failed(self) -> str | None:
        """Why the peer can no longer resume (it ended, or failed), else None."""


@dataclass
class Fault:
    """The timeline of one node loss (wall-clock seconds since the epoch, or None)."""

    kill_step: int
    kill_t: float = 0.0
    killed_node: str = ""
    step_at_kill: int | None = None
    committed_at_kill: int | None = None
    step_s: float | None = None
    """Mean seconds per step over the 20 steps before the kill (checkpoints included)."""
    ray_dead_t: float | None = None
    rejoin_t: float | None = None
    registered_t: float | None = None
    first_step_t: float | None = None
    first_step: int | None = None
    resumed_from: int | None = None
    resumed_step_t: float | None = None
    """When rank 0 first logged the step it resumed from: the work after it was lost."""
    error: str | None = None

    @property
    def steps_lost(self) -> int | None:
        if self.step_at_kill is None or self.resumed_from is None:
            return None
        return self.step_at_kill - self.resumed_from

    @property
    def seconds_lost(self) -> float | None:
        """Training time redone: from the resumed step's first logging to the kill."""
        return None if self.resumed_step_t is None else self.kill_t - self.resumed_step_t

    @property
    def resume_s(self) -> float | None:
        return None if self.first_step_t is None else self.first_step_t - self.kill_t

    @property
    def ray_detect_s(self) -> float | None:
        return None if self.ray_dead_t is None else self.ray_dead_t - self.kill_t

    @property
    def after_rejoin_s(self) -> float | None:
        if self.first_step_t is None or self.registered_t is None:
            return None
        return self.first_step_t - self.registered_t

    def as_dict(self) -> dict[str, Any]:
        derived = ["steps_lost", "seconds_lost", "resume_s", "ray_detect_s", "after_rejoin_s"]
        return asdict(self) | {k: getattr(self, k) for k in derived}


def node_loss(
    cluster: LocalCluster,
    probe: Probe,
    kill_step: int,
    rejoin_after_s: float,
    timeout_s: float,
    say: Any = print,
) -> Fault:
    """Kill the node of rank 1 at `kill_step`, bring a new one `rejoin_after_s` later,
    wait for training again (see the module docstring). Errors land in `fault.error`."""
    fault = Fault(kill_step)
    try:
        _wait_step(probe, kill_step, timeout_s)
        node = probe.rank1_node(cluster)
        if node is None:
            raise RuntimeError("no live node hosts rank 1")
        fault.committed_at_kill = probe.committed()
        fault.kill_t = cluster.kill(node)
        fault.killed_node = node.node_id
        say(f"  killed {node.name} ({node.node_id[:8]}) at step {_last(probe, fault.kill_t)}")
        _settle_kill(fault, probe)
        watcher = threading.Thread(target=_watch_dead, args=(fault, node), daemon=True)
        watcher.start()
        time.sleep(max(0.0, fault.kill_t + rejoin_after_s - time.time()))
        fault.rejoin_t = time.time()
        new = cluster.add_worker(label=node.label)  # the host comes back
        cluster.wait_alive([new.node_id])
        fault.registered_t = time.time()
        joined = fault.registered_t - fault.kill_t
        say(f"  {new.name} ({new.node_id[:8]}) joined {joined:.1f} s after the kill")
        _wait_resumed(fault, probe, timeout_s)
        watcher.join(timeout=1)
    except Exception as err:  # recorded with the evidence; the benchmark goes on
        fault.error = f"{type(err).__name__}: {err}"
    return fault


def _wait_step(probe: Probe, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while max(probe.steps(), default=0) < step:
        if (why := probe.failed()) is not None:
            raise RuntimeError(f"the run ended before step {step}: {why}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} not reached in {timeout_s:.0f} s")
        time.sleep(0.02)


def _last(probe: Probe, t: float) -> int | None:
    return max((s for s, ts in probe.steps().items() if ts <= t), default=None)


def _settle_kill(fault: Fault, probe: Probe) -> None:
    """The step reached at the kill, and the pace before it (from rank 0's own log)."""
    time.sleep(SETTLE_S)  # a step that ended as the node died reaches rank 0's log
    steps = probe.steps()
    before = sorted((s, t) for s, t in steps.items() if t <= fault.kill_t + SETTLE_S)
    fault.step_at_kill = before[-1][0] if before else None
    window = before[-21:]
    if len(window) >= 2:
        gaps = [b[1] - a[1] for a, b in zip(window, window[1:], strict=False)]
        fault.step_s = statistics.fmean(gaps)


def _watch_dead(fault: Fault, node: RayNode, timeout_s: float = 120.0) -> None:
    """When Ray's node table first shows the killed node not alive."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            row = next((n for n in ray.nodes() if n["NodeID"] == node.node_id), None)
        except Exception:  # the GCS is busy; ask again
            row = None
        if row is not None and not row["Alive"]:
            fault.ray_dead_t = time.time()
            return
        time.sleep(0.1)


def _wait_resumed(fault: Fault, probe: Probe, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (later := probe.after(fault.kill_t + SETTLE_S)):
        if (why := probe.failed()) is not None:
            raise RuntimeError(f"never trained again after the kill: {why}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no step trained within {timeout_s:.0f} s of the kill")
        time.sleep(0.05)
    fault.first_step, fault.first_step_t = later[0]
    said = probe.resumed_from(fault.kill_t)
    fault.resumed_from = said if said is not None else fault.first_step - 1
    fault.resumed_step_t = probe.steps().get(fault.resumed_from)
