"""The root `argosy` command: global options and the list of subcommands.

argosy --help
argosy chips --json
argosy --set hardware.default_cluster=a100:16 cluster
"""

from __future__ import annotations

import sys

import typer

from argosy import __version__
from argosy.cli import (
    chips,
    ckpt,
    cluster,
    demo,
    devices,
    health,
    jobs,
    launch,
    plan,
    runs,
    serve,
    server,
    services,
    sim,
    tokens,
    zygote,
)
from argosy.cli.common import State, print_error
from argosy.core.errors import ArgosyError

app = typer.Typer(
    name="argosy",
    help="Get the most useful work out of accelerator clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    config: str | None = typer.Option(None, "--config", help="YAML config file."),
    overrides: list[str] = typer.Option(  # noqa: B008  # typer's declaration style
        [], "--set", help="Override a config key: section.field=value (repeatable)."
    ),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    """argosy: plan, schedule, run and measure large-model work on mixed clusters."""
    if version:
        typer.echo(__version__)
        raise typer.Exit()
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit()
    ctx.obj = State(config, overrides)
    if config is not None or overrides:  # checked on every command, read or not
        ctx.obj.check()


app.command("chips")(chips.chips)
app.command("devices")(devices.devices)
app.command("cluster")(cluster.cluster)
app.command("plan")(plan.plan)
app.command("estimate")(plan.estimate)
app.command("launch", context_settings=launch.CONTEXT)(launch.launch)
app.add_typer(runs.app, name="runs")
app.add_typer(sim.app, name="sim")
app.add_typer(ckpt.app, name="ckpt")
app.add_typer(health.app, name="health")
app.command("server")(server.server)
app.command("serve")(serve.serve)
app.command("train-draft")(serve.train_draft)
app.command("zygote")(zygote.zygote)
for _name in ("submit", "jobs", "job", "logs", "cancel", "queues", "nodes", "cordon", "repair"):
    app.command(_name)(getattr(jobs, _name))
app.command("forget-node")(jobs.forget_node)
app.add_typer(tokens.app, name="token")
app.command("services")(services.services)
app.command("service")(services.service)
app.command("demo")(demo.demo)


def main() -> None:
    """Console entry point: user mistakes exit 2 with one line, never a traceback."""
    try:
        app()
    except ArgosyError as err:
        print_error(err)
        sys.exit(2)


if __name__ == "__main__":
    main()
