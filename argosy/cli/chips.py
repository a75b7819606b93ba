"""`argosy chips`: the chip catalog as a table or JSON."""

from __future__ import annotations

import typer
from rich.table import Table

from argosy.cli.common import console, print_json
from argosy.hardware.catalog import Chip, default_catalog


def chips(
    as_json: bool = typer.Option(False, "--json", help="Print the catalog as JSON."),
    vendor: str | None = typer.Option(None, help="Only chips of this vendor."),
) -> None:
    """List the chip catalog: peak TFLOPs, memory, links, NIC, power and source."""
    entries = [c for c in default_catalog().chips() if vendor is None or c.vendor == vendor]
    if as_json:
        print_json([chip.model_dump() for chip in entries])
        return
    console.print(_table(entries))


def _table(entries: list[Chip]) -> Table:
    table = Table(
        title="argosy chip catalog (dense peak TFLOPs)",
        caption="aliases and each entry's source: argosy chips --json",
        header_style="bold",
        box=None,  # no borders, one space between columns: every value fits 80 columns
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    for column in ("chip", "vendor"):  # never cut; the rest may wrap (pipes, CI: 80 columns)
        table.add_column(column, no_wrap=True, min_width=_widest(entries, column))
    for column in ("bf16", "fp16", "fp8", "GiB", "TB/s", "link", "GB/s", "dom", "NIC Gb/s", "W"):
        link = column == "link"
        table.add_column(column, justify="left" if link else "right", overflow="fold")
    for chip in entries:
        table.add_row(
            chip.id,
            chip.vendor,
            _num(chip.bf16_tflops),
            _num(chip.fp16_tflops),
            _num(chip.fp8_tflops),
            _num(chip.memory_gib),
            _num(chip.memory_tbps),
            chip.link.kind,
            _num(chip.link.gbps),
            str(chip.link.domain_size),
            _num(chip.nic_gbps),
            _num(chip.tdp_w),
        )
    return table


def _widest(entries: list[Chip], column: str) -> int:
    texts = [c.id if column == "chip" else c.vendor for c in entries]
    return max(len(t) for t in [column, *texts])


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:g}"
