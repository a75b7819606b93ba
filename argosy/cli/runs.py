"""`argosy runs show D`: a run's goodput summary, its faults, and a timeline plot.

argosy runs show runs/demo
argosy runs show runs/demo --json
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from argosy.cli.common import console, print_json
from argosy.core.errors import ArgosyError

app = typer.Typer(help="Inspect runs of `argosy launch`.", no_args_is_help=True)


@app.command("show")
def show(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Write timeline.png."),
) -> None:
    """Print wall, productive and lost time by cause, the faults, and plot the timeline."""
    from argosy.runtime.events import EVENTS_FILE, SUMMARY_FILE, read_events
    from argosy.runtime.goodput import summarize

    events_path = run_dir / EVENTS_FILE
    if not events_path.exists():
        raise ArgosyError(f"{run_dir} is not a run directory (no {EVENTS_FILE})")
    events = read_events(events_path)
    summary_path = run_dir / SUMMARY_FILE
    summary = _load_summary(summary_path) or summarize(events)
    if as_json:
        print_json(summary)
        return
    _print(summary)
    if plot:
        from argosy.runtime.plot import plot_timeline

        path = plot_timeline(events, summary, run_dir / "timeline.png")
        console.print(f"timeline: {path}")


def _load_summary(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # rebuilt from the event log instead


def _print(summary: dict) -> None:
    table = Table(title="goodput", show_header=False)
    wall = summary["wall_s"] or 1.0
    table.add_row("status", str(summary.get("status", "?")))
    table.add_row("final step / loss", f"{summary['final_step']} / {summary['final_loss']}")
    table.add_row("wall", f"{summary['wall_s']:.2f} s")
    table.add_row("productive", f"{summary['productive_s']:.2f} s")
    table.add_row("effective training time", f"{summary['effective_training_time']:.1%}")
    for cause, seconds in summary["lost_s"].items():
        table.add_row(f"lost: {cause}", f"{seconds:.2f} s ({seconds / wall:.1%})")
    console.print(table)
    if not summary["faults"]:
        console.print("no faults")
        return
    faults = Table(title="faults")
    for column in (
        "kind",
        "rank",
        "injected s",
        "detected s",
        "latency s",
        "resumed from",
        "lost s (det/restart/reload/redone)",
        "detail",
    ):
        faults.add_column(column)
    for f in summary["faults"]:
        lost = f.get("lost_s") or {}  # a warning (straggler, action "warn") lost nothing
        parts = "/".join(_num(lost.get(k)) for k in ("detection", "restart", "reload", "redone"))
        faults.add_row(
            f["kind"],
            str(f["rank"]),
            _num(f.get("injected_at_s")),
            _num(f["detected_at_s"]),
            _num(f.get("detect_latency_s")),
            str(f.get("resumed_from_step") or "-"),
            parts if lost else f.get("action", "-"),
            f.get("detail") or "",
        )
    console.print(faults)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
