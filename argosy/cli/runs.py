"""`argosy runs show D`: a run's goodput summary, its faults, and a timeline plot.

argosy runs show runs/demo
argosy runs show runs/demo --json

The latest run of the directory is shown; earlier runs launched into it (kept under
`history/`) are listed below it. A run whose launcher died without writing its summary
reads as interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from argosy.cli.common import console, print_json
from argosy.cli.paths import writable_file
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
    from argosy.runtime.history import list_history

    events_path = run_dir / EVENTS_FILE
    if not events_path.exists():
        earlier = [r["path"] for r in list_history(run_dir)]
        hint = f"; its earlier runs: {', '.join(earlier)}" if earlier else ""
        raise ArgosyError(f"{run_dir} holds no run (no {EVENTS_FILE}){hint}")
    if plot and not as_json:
        writable_file(run_dir / "timeline.png", "--plot (use --no-plot to skip it)")
    events = read_events(events_path)
    if not events and not (run_dir / SUMMARY_FILE).exists():
        raise ArgosyError(_no_events(events_path))
    summary = _load_summary(run_dir / SUMMARY_FILE, events) or summarize(events)
    summary.setdefault("status", _status_without_summary(events))
    earlier = list_history(run_dir)
    if as_json:
        print_json(summary | {"earlier_runs": earlier})
        return
    _print(summary)
    _print_history(earlier)
    if plot:
        from argosy.runtime.plot import plot_timeline

        path = plot_timeline(events, summary, run_dir / "timeline.png")
        console.print(f"timeline: {path}")


def _no_events(path: Path) -> str:
    """Why a run's event log gave no event: empty, or its first line is not one."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    first = next(((n, line) for n, line in enumerate(lines, 1) if line.strip()), None)
    if first is None:
        return f"{path} is empty: the run logged no event"
    number, line = first
    shown = line if len(line) <= 60 else line[:57] + "..."
    return f"{path}:{number}: not an event (a JSON object with 'event'): {shown!r}; no run to show"


def _status_without_summary(events: list[dict]) -> str:
    """running while the launcher lives; interrupted when it died before its summary."""
    from argosy.core.procs import pid_alive

    if any(e["event"] == "end" for e in events):
        return next(e.get("status", "?") for e in events if e["event"] == "end")
    start = next((e for e in events if e["event"] == "start"), {})
    pid = start.get("launcher_pid")
    return "running" if isinstance(pid, int) and pid_alive(pid) else "interrupted"


def _print_history(earlier: list[dict]) -> None:
    if not earlier:
        return
    table = Table(title="earlier runs in this directory (oldest first)")
    for column in ("run", "started", "status", "final step", "restarts", "path"):
        table.add_column(column)
    for run in earlier:
        table.add_row(
            str(run["run_id"]),
            str(run["started"] or "-"),
            str(run["status"]),
            str(run["final_step"] if run["final_step"] is not None else "-"),
            str(run["restarts"] if run["restarts"] is not None else "-"),
            run["path"],
        )
    console.print(table)


def _load_summary(path: Path, events: list[dict]) -> dict | None:
    """summary.json when it is the finished summary of this run, else None (rebuilt)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # rebuilt from the event log instead
    if not isinstance(data, dict) or data.get("status") == "running" or "wall_s" not in data:
        return None  # the launcher died before writing the final summary
    return data


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
    if summary.get("preflight"):
        table.add_row("preflight", _preflight_text(summary["preflight"]))
    if summary.get("node_health"):
        health = summary["node_health"]
        evidence = f"{health['evidence']} piece(s) of evidence, {health['file']}"
        table.add_row("node health", f"{health['node']}: {health['state']} ({evidence})")
    console.print(table)
    _print_energy(summary.get("energy"))
    from argosy.cli.mixed_view import print_throughput

    print_throughput(console, summary.get("throughput"))  # mixed-chip launches
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


def _print_energy(energy: dict | None) -> None:
    """The energy table beside the goodput one (summary.json `energy`, runtime.energy)."""
    if energy is None:
        return  # a summary from before the meter existed
    table = Table(title="energy", show_header=False)
    if not energy.get("measured"):
        table.add_row("energy", f"not measured ({energy.get('reason') or 'no meter read'})")
        console.print(table)
        return
    total = energy["total_j"] or 1.0
    table.add_row("total", f"{energy['total_j']:.1f} J")
    table.add_row("productive", f"{energy['productive_j']:.1f} J")
    for cause, joules in energy["lost_j"].items():
        table.add_row(f"lost: {cause}", f"{joules:.1f} J ({joules / total:.1%})")
    all_in = _num(energy["joules_per_step_all_in"])
    table.add_row("J per step", f"{_num(energy['joules_per_step'])} (all-in {all_in})")
    for work in ("tokens", "samples"):
        per_joule = energy.get(f"{work}_per_joule")
        table.add_row(f"{work} per joule", "-" if per_joule is None else f"{per_joule:.4g}")
    for device, d in energy["devices"].items():
        if d["energy_j"] is None:
            table.add_row(device, "not measured")
            continue
        watts = f"avg {d['avg_w']:.1f} W, peak {d['peak_w']:.1f} W"
        table.add_row(device, f"{d['energy_j']:.1f} J, {watts} ({d['method']})")
    for reader, why in (energy.get("not_measured") or {}).items():
        table.add_row(f"{reader}", f"not read: {why}")
    console.print(table)


def _preflight_text(checked: dict) -> str:
    if checked.get("refused"):
        return f"refused: {checked['refused']}"
    left = ", ".join(f"device {x['device']}" for x in checked.get("excluded") or [])
    used = ", ".join(map(str, checked.get("use") or []))
    return f"{checked['verdict']}; used device(s) {used}" + (f"; left out {left}" if left else "")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
