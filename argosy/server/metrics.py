"""`/metrics` for Prometheus: read from the scheduler and the store at scrape time.

Queue depth (pending jobs per queue), jobs by state, allocation by chip type, devices
used per node (per-device use: the local and Ray executors place whole devices), the
effective training time of finished jobs (the runtime's goodput), the last cycle's
duration, the tidal lease (yields, reclaims and resizes with their seconds, devices
lent now), and energy over the last 24 h (joules metered per node, the energy factor with
the configured PUE: `server.energy`). A registry per app, so several servers live in one
test process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from argosy.server.control import Control

ENERGY_WINDOW_S = 24 * 3600.0


class ServerCollector(Collector):
    """Collects the control plane's gauges on each scrape."""

    def __init__(self, control: Control) -> None:
        self.control = control

    def collect(self) -> Iterator[Metric]:
        ctl = self.control
        counts = ctl.store.count_jobs()
        depth = GaugeMetricFamily("argosy_queue_pending_jobs", "Pending jobs", labels=["queue"])
        states = GaugeMetricFamily(
            "argosy_jobs", "Jobs by queue and state", labels=["queue", "state"]
        )
        pending: dict[str, int] = {}
        for (queue, state), n in counts.items():
            states.add_metric([queue, state], n)
            if state == "pending":
                pending[queue] = pending.get(queue, 0) + n
        for queue in ctl.scheduling.sched.tree.leaves:
            depth.add_metric([queue], pending.get(queue, 0))
        yield depth
        yield states
        yield from self._devices()
        yield self._goodput()
        cycle = GaugeMetricFamily("argosy_scheduler_cycle_seconds", "Last scheduler cycle")
        cycle.add_metric([], ctl.cycle_s)
        yield cycle
        yield from self._lease()
        yield from self._energy()

    def _lease(self) -> Iterator[Metric]:
        lease, services = self.control.lease, self.control.services
        kinds = ("yield", "reclaim", "resize")
        count = CounterMetricFamily(
            "argosy_tidal_transitions", "Tidal lease transitions done", labels=["kind"]
        )
        seconds = CounterMetricFamily(
            "argosy_tidal_seconds",
            "Seconds spent in them: yield = sleep, reclaim = wake + first token, "
            "resize_stop = stop until exit, resize_restart = relaunch until restored",
            labels=["kind"],
        )
        for kind in kinds:
            count.add_metric([kind], lease.counts[kind])
        for kind in ("yield", "reclaim", "resize_stop", "resize_restart"):
            seconds.add_metric([kind], lease.seconds[kind])
        lent = GaugeMetricFamily("argosy_tidal_lent_devices", "Devices of asleep replicas")
        asleep = sum(
            r["state"] == "asleep" for row in services.active.values() for r in row["replicas"]
        )
        lent.add_metric([], asleep)
        yield count
        yield seconds
        yield lent

    def _energy(self, window_s: float = ENERGY_WINDOW_S) -> Iterator[Metric]:
        fleet = self.control.energy.fleet(time.time(), window_s, 1)
        node = GaugeMetricFamily(
            "argosy_node_energy_joules",
            "IT joules metered on the node by attempts that ran in the last 24 h",
            labels=["node"],
        )
        for row in fleet["nodes"]:
            if row["total_j"] is not None:
                node.add_metric([row["node"]], row["total_j"])
        yield node
        if fleet["energy_factor"] is not None:  # absent, not 0, when nothing was metered
            factor = GaugeMetricFamily(
                "argosy_energy_factor",
                "Productive IT joules / (IT joules x configured PUE), last 24 h",
            )
            factor.add_metric([], fleet["energy_factor"])
            yield factor
        if fleet["pue"] is not None:
            pue = GaugeMetricFamily("argosy_pue_configured", "The facility PUE as configured")
            pue.add_metric([], fleet["pue"])
            yield pue

    def _devices(self) -> Iterator[Metric]:
        s = self.control.scheduling
        total = GaugeMetricFamily("argosy_devices", "Devices by chip type", labels=["chip"])
        used = GaugeMetricFamily(
            "argosy_devices_allocated", "Devices allocated by chip type", labels=["chip"]
        )
        node = GaugeMetricFamily(
            "argosy_node_devices_used", "Devices in use per node", labels=["node", "chip"]
        )
        by_chip: dict[str, list[int]] = {}
        for n in s.nodes:
            k = s.used_on(n.name)
            node.add_metric([n.name, n.chip], k)
            agg = by_chip.setdefault(n.chip, [0, 0])
            agg[0] += n.devices
            agg[1] += k
        for chip, (n, k) in by_chip.items():
            total.add_metric([chip], n)
            used.add_metric([chip], k)
        yield total
        yield used
        yield node

    def _goodput(self) -> Metric:
        mean = self.control.store.mean_effective_training_time()
        g = GaugeMetricFamily(
            "argosy_effective_training_time",
            "Mean effective training time of finished jobs, each over all its attempts",
        )
        g.add_metric([], mean or 0.0)
        return g


def make_registry(control: Control) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ServerCollector(control))
    return registry
