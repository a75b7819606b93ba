"""`argosy devices`: what this machine has, through the backend registry."""

from __future__ import annotations

import dataclasses

import typer
from rich.table import Table

from argosy.cli.common import console, print_json


def devices(
    as_json: bool = typer.Option(False, "--json", help="Print the devices as JSON."),
    include_cpu: bool = typer.Option(False, "--cpu", help="Also list the host CPU."),
) -> None:
    """Discover the accelerators on this machine (the CPU when there are none)."""
    from argosy.hardware.discovery import discover

    found = discover(include_cpu=include_cpu)
    if as_json:
        print_json([dataclasses.asdict(device) for device in found])
        return
    table = Table(title="devices on this machine", header_style="bold")
    for column in ("backend", "index", "name", "memory GiB", "catalog", "details"):
        table.add_column(column)
    for device in found:
        details = ", ".join(f"{k}={v}" for k, v in device.details.items())
        table.add_row(
            device.backend,
            str(device.index),
            device.name,
            f"{device.memory_gib:g}",
            device.catalog_id or "[yellow]not in catalog[/]",
            details,
        )
    console.print(table)
