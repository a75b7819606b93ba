"""Node faults as the scheduler sees them: who was hit, where they go, which nodes to
keep out.

    node_failed(sched, node, now, hardware=True)  -> decisions for the workloads hit
    node_repaired(sched, node)                    -> the node is placeable again

A transient fault (process crash, NCCL error) restarts the gang on the same devices. A
hardware fault takes the node down: a gang member moves to a hot spare of its group
(same leaf switch if possible) and the gang restarts; with no spare at hand the gang is
requeued. Inference replicas on the node are dropped and re-placed by the next cycle.
A node that fails `quarantine_failures` times within `quarantine_window_s` is
quarantined: it stays down when repaired until `release_quarantine` is called.
"""

from __future__ import annotations

import numpy as np

from argosy.scheduler.decisions import Decision
from argosy.scheduler.workload import Allocation


def node_failed(sched, node: int, now: float, *, hardware: bool) -> list[Decision]:
    cap = sched.cap
    out: list[Decision] = []
    if not cap.up[node]:
        return out
    sched.services_settled = -1
    if cap.spare[node]:  # an idle held spare: nothing runs there
        if hardware:
            cap.mark_down(node)
            _after_hardware_fault(sched, node, now)
        return out
    for w in sched.services:
        before = w.devices
        kept = []
        for chunk in w.replicas:
            hit = chunk.nodes == node
            if hit.any() and hardware:
                lost = Allocation(chunk.group, chunk.nodes[hit], chunk.counts[hit])
                cap.give(lost)
                sched.tree.add(w.queue, cap.chips[chunk.group], -lost.devices)
                chunk = Allocation(chunk.group, chunk.nodes[~hit], chunk.counts[~hit])
            if len(chunk.nodes):
                kept.append(chunk)
        w.replicas = kept
        w.recount()
        if w.devices != before:
            out.append(Decision("replicas", w, before, w.devices, "node failed"))
    hit = [w for w in sched.running.values() if w.alloc is not None and node in w.alloc.nodes]
    for w in hit:
        out.append(_recover(sched, w, node, now, hardware))
    if hardware:
        cap.mark_down(node)
        _after_hardware_fault(sched, node, now)
    return out


def _after_hardware_fault(sched, node: int, now: float) -> None:
    if sched.policy.quarantine:
        _count_failure(sched, node, now)


def _recover(sched, w, node: int, now: float, hardware: bool) -> Decision:
    n = w.devices
    if not hardware:
        return Decision("restart", w, n, n, "transient fault; restart in place")
    if sched.policy.hot_spares:
        spare = sched.take_spare(w.alloc.group, int(sched.cap.leaf[node]))
        if spare is not None:
            i = int(np.flatnonzero(w.alloc.nodes == node)[0])
            count = w.alloc.counts[i : i + 1]
            sched.cap.give(Allocation(w.alloc.group, np.array([node]), count))
            sched.cap.take(Allocation(w.alloc.group, np.array([spare]), count))
            nodes = w.alloc.nodes.copy()
            nodes[i] = spare
            w.alloc = Allocation(w.alloc.group, nodes, w.alloc.counts)
            return Decision("restart", w, n, n, "node failed; moved to a hot spare")
    sched.release(w)
    sched.enqueue(w)
    return Decision("requeue", w, n, 0, "node failed; no spare")


def _count_failure(sched, node: int, now: float) -> None:
    window = sched.config.quarantine_window_s
    times = [t for t in sched.failures.get(node, []) if now - t <= window] + [now]
    sched.failures[node] = times
    if len(times) >= sched.config.quarantine_failures:
        sched.quarantined.add(node)


def node_repaired(sched, node: int) -> bool:
    """Bring `node` back unless it is quarantined; returns whether it is back."""
    if sched.cap.up[node] or node in sched.quarantined:
        return False
    sched.cap.mark_up(node)
    return True


def release_quarantine(sched, node: int) -> None:
    """The node was replaced: forget its history and bring it back."""
    sched.quarantined.discard(node)
    sched.failures.pop(node, None)
    sched.cap.mark_up(node)
