"""`argosy cluster`: load and describe a cluster (shorthand or YAML)."""

from __future__ import annotations

import typer
from rich.table import Table

from argosy.cli.common import config_of, console, print_json
from argosy.hardware.cluster import Cluster
from argosy.hardware.loader import load_cluster


def cluster(
    ctx: typer.Context,
    spec: str | None = typer.Argument(None, help="CHIP:COUNT[+CHIP:COUNT...] or a YAML file."),
    nic_gbps: float | None = typer.Option(None, help="Override the per-device NIC Gb/s."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster as JSON."),
) -> None:
    """Validate a cluster description and show its groups and topology."""
    resolved = load_cluster(spec or config_of(ctx).hardware.default_cluster, nic_gbps=nic_gbps)
    if as_json:
        print_json(cluster_summary(resolved))
        return
    console.print(_table(resolved))


def cluster_summary(resolved: Cluster) -> dict:
    """The cluster as plain data (groups, levels and switch counts)."""
    levels = [level.model_dump() for level in resolved.levels]
    switches = [len({node.path[i] for node in resolved.nodes}) for i in range(len(levels))]
    return {
        "name": resolved.name,
        "devices": resolved.num_devices,
        "nodes": resolved.num_nodes,
        "domains": len({node.domain for node in resolved.nodes}),
        "levels": [{**lv, "switches": n} for lv, n in zip(levels, switches, strict=True)],
        "groups": [
            {
                "name": g.name,
                "chip": g.chip.id,
                "vendor": g.chip.vendor,
                "devices": g.num_devices,
                "nodes": g.num_nodes,
                "devices_per_node": g.devices_per_node,
                "domain_size": g.domain_size,
                "nic_gbps": g.nic_gbps,
            }
            for g in resolved.groups
        ],
    }


def _table(resolved: Cluster) -> Table:
    summary = cluster_summary(resolved)
    levels = " -> ".join(f"{lv['name']} x{lv['switches']}" for lv in summary["levels"])
    table = Table(
        title=f"{resolved.name}: {summary['devices']} devices, {summary['nodes']} nodes, "
        f"{summary['domains']} domains; {levels}",
        header_style="bold",
    )
    for column in ("group", "chip", "vendor", "devices", "nodes", "per node", "domain", "NIC Gb/s"):
        table.add_column(column)
    for g in summary["groups"]:
        table.add_row(
            g["name"],
            g["chip"],
            g["vendor"],
            str(g["devices"]),
            str(g["nodes"]),
            str(g["devices_per_node"]),
            str(g["domain_size"]),
            f"{g['nic_gbps']:g}",
        )
    return table
