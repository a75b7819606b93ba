"""`argosy sim`: generate a calibrated trace, replay it through the scheduler.

    argosy sim generate --cluster h100:10000 --days 30 --out runs/t
    argosy sim run --cluster h100:10000 --queues runs/t/queues.yaml \
        --trace runs/t/trace.jsonl --policy argosy --json
    argosy sim run ... --compare --plot runs/t/compare.png
    argosy sim run ... --why          # where unallocated device-time went, per chip pool;
                                      # reservations, backfills and resize churn

Only typer and rich load at import time; the simulator is imported inside the commands
(no torch, ray or fastapi anywhere on this path).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from argosy.cli.common import config_of, console, err_console, print_json, usage_error
from argosy.cli.paths import writable_dir, writable_file

app = typer.Typer(help="Cluster simulator: calibrated traces, policies side by side.",
                  no_args_is_help=True)  # fmt: skip

COMPARED = ("fifo", "quota", "argosy")


@app.command("generate")
def generate(
    cluster: str = typer.Option(..., "--cluster", help="CHIP:COUNT[+...] or a YAML file."),
    days: float = typer.Option(..., "--days", min=0.01, help="Length of the trace in days."),
    out: Path = typer.Option(..., "--out", help="Directory for trace.jsonl and queues.yaml."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    load: float = typer.Option(1.0, "--load", min=0.05, help="Offered work / capacity."),
) -> None:
    """Write a synthetic LLM-cluster trace calibrated to public traces."""
    from argosy.hardware.loader import load_cluster
    from argosy.sim.generate import generate as make
    from argosy.sim.generate import write_generated

    writable_dir(out, "--out")
    resolved = load_cluster(cluster)
    with console.status(f"generating {days:g} days for {resolved.num_devices} devices"):
        gen = make(resolved, days, seed=seed, load=load)
        trace, queues = write_generated(gen, out)
    kinds: dict[str, int] = {}
    for r in gen.records:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    console.print(f"wrote {trace} ({len(gen.records)} workloads: {kinds}) and {queues}")
    console.print(f"offered load: {gen.offered_load:.3f} x the cluster's capacity over "
                  f"{days:g} days")  # fmt: skip


@app.command("run")
def run(
    ctx: typer.Context,
    cluster: str = typer.Option(..., "--cluster", help="CHIP:COUNT[+...] or a YAML file."),
    queues: Path = typer.Option(..., "--queues", help="Queue tree YAML."),
    trace: Path = typer.Option(..., "--trace", help="Trace JSONL."),
    policy: str | None = typer.Option(
        None, "--policy", help="fifo, quota or argosy (default); not with --compare."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the fault model."),
    compare: bool = typer.Option(False, "--compare", help="Run fifo, quota and argosy."),
    plot: Path | None = typer.Option(None, "--plot", help="PNG path (default with --compare)."),
    on_error: str = typer.Option("stop", "--on-error", help="Malformed lines: stop or skip."),
    plans: str = typer.Option(
        "planner", "--plans", help="planner (argosy runs planner plans) or stock (all stock)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report(s) as JSON."),
    why: bool = typer.Option(
        False, "--why", help="Also print where unallocated device-time went, per chip pool."
    ),
) -> None:
    """Replay a trace through the scheduler and print the five-factor report."""
    from argosy.sim.runner import run_policies

    if on_error not in ("stop", "skip"):
        raise typer.BadParameter("must be stop or skip", param_hint="--on-error")
    if plans not in ("planner", "stock"):
        raise typer.BadParameter("must be planner or stock", param_hint="--plans")
    if compare or plot:  # checked before minutes of replay, not after
        writable_file(plot or trace.with_name("sim_compare.png"), "--plot")
    if compare and policy is not None:
        raise usage_error(f"--compare runs {', '.join(COMPARED)}; leave out --policy {policy}")
    names = list(COMPARED) if compare else [policy or "argosy"]
    config = config_of(ctx)
    kwargs = {"seed": seed, "on_error": on_error, "scheduler": config.scheduler}
    from argosy.sim.isolation import HealthPolicyIsolation

    kwargs["isolation"] = lambda: HealthPolicyIsolation(config.scheduler)
    kwargs["sim"] = config.sim.model_copy(update={"plans": plans})
    if as_json or not console.is_terminal:
        reports, devices, skipped = run_policies(cluster, queues, trace, names, **kwargs)
    else:
        reports, devices, skipped = _with_progress(cluster, queues, trace, names, kwargs)
    for line in skipped[:20]:
        err_console.print(f"[yellow]skipped[/] {escape(line)}", highlight=False, emoji=False)
    if compare or plot:
        from argosy.sim.plot import plot_allocation

        path = plot or trace.with_name("sim_compare.png")
        plot_allocation(reports, devices, path)
        if not as_json:
            console.print(f"plot: {path}")
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in reports]
    if as_json:
        out = public[0] if len(public) == 1 else {"runs": public, "ratios": _ratios(public)}
        print_json(out)
        return
    console.print(_table(public))
    for name, value in _ratios(public).items():
        console.print(f"five-factor product {name}: {value:.2f}x")
    if why:
        for r in public:
            console.print(_why_table(r))
            if r.get("backfill", {}).get("estimates"):
                console.print(_backfill_table(r))


def _why_table(report: dict) -> Table:
    """Owned device-time of each chip pool split into allocated and why the rest idled."""
    from argosy.sim.idle import format_rows

    idle = report["idle"]
    table = Table(title=f"{report['policy']}: where the device-time went", header_style="bold")
    table.add_column("category")
    for pool in idle:
        table.add_column(pool, justify="right")
    for row in format_rows(idle):
        table.add_row(*row)
    return table


def _backfill_table(report: dict) -> Table:
    """Reservations and backfills of a policy with reservations, the estimates' error and
    the resize churn."""
    b, churn = report["backfill"], report.get("resize_churn", {})
    est = b["estimates"]
    table = Table(title=f"{report['policy']}: reservations, backfill, resizes",
                  header_style="bold")  # fmt: skip
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("workloads reserved / started", f"{b['reserved']} / {b['reserved_started']}"),
        ("late vs promise p50 / p90 (s)", f"{b['late_p50_s']:.0f} / {b['late_p90_s']:.0f}"),
        ("started ahead of a reservation (end before it)", str(b["backfilled"])),
        ("started in a reservation's extra devices", str(b["in_extra"])),
        ("shapes refused for their run time", str(b["refused"])),
        ("gangs started on idle service guarantees", str(b["lent_starts"])),
        ("run-time estimate error, median / p90",
         f"{100 * est['median_abs_error']:.1f}% / {100 * est['p90_abs_error']:.1f}%"),
        ("resizes per elastic job-day", f"{churn.get('resizes_per_job_day', 0.0):.2f}"),
        ("resize stalls, share of device-time", f"{100 * churn.get('stall_share', 0.0):.2f}%"),
    ]  # fmt: skip
    for row in rows:
        table.add_row(*row)
    return table


def _with_progress(cluster, queues, trace, names, kwargs):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from argosy.sim.runner import run_policies

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
            "{task.percentage:>3.0f}%"), TimeElapsedColumn(), console=console) as bar:  # fmt: skip
        tasks = {n: bar.add_task(f"sim {n}", total=1.0) for n in names}

        def advance(name: str, fraction: float) -> None:
            bar.update(tasks[name], completed=fraction)

        return run_policies(cluster, queues, trace, names, progress=advance, **kwargs)


def _table(reports: list[dict]) -> Table:
    table = Table(title="simulation", header_style="bold")
    table.add_column("metric")
    for r in reports:
        table.add_column(r["policy"], justify="right")
    rows = [
        ("allocation rate", lambda r: f"{r['allocation_rate']:.1%}"),
        ("useful rate", lambda r: f"{r['useful_rate']:.1%}"),
        ("effective training time", lambda r: f"{r['effective_training_time']:.1%}"),
        ("inference SLO attainment", lambda r: f"{r['slo_attainment']:.2%}"),
        ("eval queue p50 / p90 (s)", lambda r: _q(r, "eval")),
        ("debug queue p50 / p90 (s)", lambda r: _q(r, "debug")),
        ("train queue p50 / p90 (s)", lambda r: _q(r, "train")),
        ("preemptions", lambda r: str(r["preemptions"])),
        ("resizes", lambda r: str(r["resizes"])),
        ("faults (requeued)", lambda r: f"{r['faults']} ({r['fault_requeues']})"),
        ("rejected at submission", lambda r: str(r["rejected"])),
        *[(f"x {name.replace('_', ' ')} (factor)", _factor(name)) for name in FACTORS],
        ("five-factor product", lambda r: f"{r['five_factor']['product']['value']:.3f}"),
        (
            "energy factor (useful IT / IT x PUE)",
            lambda r: f"{r['five_factor']['energy_efficiency']['value']:.3f}",
        ),
        ("facility energy (MWh)", lambda r: f"{r['energy']['facility_energy_mwh']:.1f}"),
        ("energy per delivered PFLOP (J)", lambda r: f"{r['energy']['joules_per_pflop']:.0f}"),
        ("sim wall (s)", lambda r: f"{r['sim_wall_s']:.1f}"),
    ]
    for name, cell in rows:
        table.add_row(name, *[cell(r) for r in reports])
    return table


FACTORS = ("resource_utilization", "effective_training_time", "single_chip_efficiency",
           "parallel_scaling")  # fmt: skip


def _factor(name: str):  # noqa: ANN202  # a cell function
    return lambda r: f"{r['five_factor'][name]['value']:.3f}"


def _ratios(reports: list[dict]) -> dict[str, float]:
    """argosy's five-factor product over each other policy's."""
    product = {r["policy"]: r["five_factor"]["product"]["value"] for r in reports}
    if "argosy" not in product:
        return {}
    return {f"argosy / {p}": product["argosy"] / v for p, v in product.items()
            if p != "argosy" and v > 0}  # fmt: skip


def _q(report: dict, kind: str) -> str:
    q = report["queue_s"].get(kind)
    return f"{q['p50']:.0f} / {q['p90']:.0f}" if q else "-"
