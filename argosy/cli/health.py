"""`argosy health check`: probe this node's devices and print the verdict.

argosy health check                         # rich table; exit 0 healthy, 1 degraded/failed
argosy health check --json                  # {"verdict", "checks": [...], ...}
argosy health check --emulate-slow 1:0.5    # emulation: rank 1 throttled to half speed
argosy health check --ranks 4               # a CPU node checked with 4 ranks

torch loads only when the check runs (inside its ranks); usage errors exit 2.
"""

from __future__ import annotations

import typer
from rich.table import Table

from argosy.cli.common import config_of, console, print_json

app = typer.Typer(help="Node health checks.", no_args_is_help=True)

_COLOURS = {"healthy": "green", "degraded": "yellow", "failed": "red", "not_applicable": "dim"}
_SHORT = {"not_applicable": "n/a"}


@app.command("check")
def check(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    emulate_slow: list[str] = typer.Option(
        [],
        "--emulate-slow",
        metavar="RANK:FACTOR",
        help="Emulation: throttle a rank to FACTOR of its speed, e.g. 1:0.5 (repeatable).",
    ),
    ranks: int | None = typer.Option(
        None,
        "--ranks",
        help="Ranks to check (default: every device; CPU node: min(cores, 4), at least 2).",
    ),
) -> None:
    """Measure GEMM, memory, host-device copy and collective bandwidth; read vendor signals."""
    from argosy.health import run_check
    from argosy.health.throttle import parse_slow

    slow = parse_slow(emulate_slow)
    report = run_check(config_of(ctx).health, slow=slow, ranks=ranks)
    if as_json:
        print_json(report.to_json())
    else:
        _print_table(report)
    raise typer.Exit(code=report.exit_code)


def _print_table(report) -> None:  # noqa: ANN001  # HealthReport, imported late
    table = Table(title=f"node health ({report.node.device_type})", header_style="bold")
    for column in ("check", "value", "unit", "expected", "factor", "verdict", "detail"):
        table.add_column(column, justify="right" if column in ("value", "expected") else "left")
    for c in report.checks:
        colour = _COLOURS[c.verdict.value]
        table.add_row(
            c.name,
            _num(c.value),
            c.unit,
            _num(c.expected),
            _num(c.factor),
            f"[{colour}]{_SHORT.get(c.verdict.value, c.verdict.value)}[/]",
            c.detail,
        )
    console.print(table)
    colour = _COLOURS[report.verdict.value]
    console.print(
        f"verdict: [{colour}]{report.verdict.value}[/] in {report.elapsed_s:.1f} s; "
        f"{report.node.num_ranks} ranks over {report.node.dist_backend}; "
        f"expectations: {report.node.basis}",
        highlight=False,
    )
    for slow in report.slow_devices():
        console.print(f"slow device: rank {slow['rank']} at {slow['factor']:g}x its peers")
    if report.emulated_slow:
        console.print(f"emulated slow ranks (throttle): {report.emulated_slow}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
