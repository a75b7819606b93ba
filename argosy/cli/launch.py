"""`argosy launch`: run a training script as N ranks, watch them, restart on faults.

argosy launch --nproc-per-node 2 --run-dir runs/demo examples/train_gpt.py --steps 60
argosy launch --nproc-per-node 2 --inject kill:rank=1:step=30 examples/train_gpt.py
argosy launch --nproc-per-node 2 --tee examples/train_gpt.py   # ranks' output, "[rank1]: ..."

A multi-node launch shares one checkpoint store (--ckpt-dir, default <run dir>/checkpoints;
the ranks get it as ARGOSY_CKPT_DIR): before any rank starts, each node writes a probe
file there and node rank 0 waits (runtime.store_probe_timeout_s) to see them all; a store
that is not shared fails the launch at once (exit 2).

Launching again into a --run-dir moves the previous run under <run dir>/history/ (its
checkpoints stay, so training goes on from them). One console line per fault, detection
and restart. SIGINT or SIGTERM stop the ranks and leave a summary marked interrupted.

Everything after the script is passed to it. torch is never imported here; the ranks
import it themselves.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import typer
from rich.markup import escape

from argosy.cli.common import config_of, console, err_console
from argosy.cli.paths import writable_dir
from argosy.core.errors import ArgosyError

CONTEXT = {"allow_interspersed_args": False, "ignore_unknown_options": True}


def launch(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="Training script (.py) or executable."),
    script_args: list[str] = typer.Argument(None, help="Arguments for the script."),
    nproc_per_node: int = typer.Option(..., "--nproc-per-node", min=1, help="Ranks per node."),
    nnodes: int = typer.Option(1, "--nnodes", min=1, help="Nodes (static rendezvous)."),
    node_rank: int = typer.Option(0, "--node-rank", min=0, help="This node's index."),
    node_sizes: str | None = typer.Option(
        None,
        "--node-sizes",
        metavar="R0,R1,...",
        help="Ranks on each node when they differ (a packed placement); default: "
        "--nproc-per-node on every node.",
    ),
    master_addr: str = typer.Option("127.0.0.1", "--master-addr", help="Rank 0's host."),
    master_port: int | None = typer.Option(None, "--master-port", help="Default: a free port."),
    max_restarts: int | None = typer.Option(None, "--max-restarts", min=0, help="Restarts."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Default: runs/<time>."),
    ckpt_dir: Path | None = typer.Option(
        None,
        "--ckpt-dir",
        help="The job's checkpoint store, one path for every node (ranks get it as "
        "ARGOSY_CKPT_DIR). Default: <run dir>/checkpoints.",
    ),
    hang_timeout: float | None = typer.Option(
        None, "--hang-timeout", min=0.1, help="Floor of the hang threshold, seconds."
    ),
    straggler_policy: str | None = typer.Option(None, "--straggler-policy", help="warn|restart"),
    spares: int | None = typer.Option(None, "--spares", min=0, help="Spare device slots."),
    inject: list[str] = typer.Option([], "--inject", help="Fault to inject (repeatable)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    plan: Path | None = typer.Option(None, "--plan", help="Plan from `argosy plan --json`."),
    emulate_chips: str | None = typer.Option(
        None, "--emulate-chips", help="CHIP:N,... chips the ranks play (CPU emulation)."
    ),
    rebalance: bool = typer.Option(
        True, "--rebalance/--no-rebalance", help="Mixed plans: batch shares follow measured speeds."
    ),
    tee: bool = typer.Option(False, "--tee", help="Print the ranks' output as \\[rankN]: ..."),
    preflight: bool = typer.Option(
        False, "--preflight", help="Health-check the devices first; leave out or refuse bad ones."
    ),
    emulate_slow: list[str] = typer.Option(
        [], "--emulate-slow", metavar="RANK:FACTOR", help="Preflight emulation: a slow device."
    ),
) -> None:
    """Run a script as fault-tolerant ranks; resume from the latest flash checkpoint."""
    from argosy.runtime.board import default_board_path
    from argosy.runtime.inject import parse_injection

    if node_rank >= nnodes:
        raise ArgosyError(f"--node-rank {node_rank} must be below --nnodes {nnodes}")
    sizes = _node_sizes(node_sizes, nnodes, node_rank, nproc_per_node)
    world = sum(sizes) if sizes else nnodes * nproc_per_node
    injections = [parse_injection(spec, world) for spec in inject]
    config = _runtime_config(ctx, max_restarts, hang_timeout, straggler_policy, spares)
    path = Path(script)
    if not path.exists():
        raise ArgosyError(f"script '{script}' not found")
    command = [sys.executable, str(path)] if path.suffix == ".py" else [str(path)]
    command += list(script_args or [])
    run_dir = writable_dir(run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"), "--run-dir")
    if ckpt_dir is not None or nnodes > 1:  # every node writes there: prove it can
        writable_dir(ckpt_dir or run_dir / "checkpoints", "--ckpt-dir")
    from argosy.runtime.history import archive_previous, check_not_busy

    check_not_busy(run_dir)  # before a preflight, not after it
    from argosy.runtime.group import GroupSpec

    run_id = f"{time.strftime('%H%M%S')}-{abs(hash(str(run_dir.resolve()))) % 10**6:06d}"
    spec = GroupSpec(
        command=command,
        nproc_per_node=nproc_per_node,
        run_dir=run_dir,
        board_path=default_board_path(run_id),
        t0=0.0,
        run_id=run_id,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        max_restarts=config.max_restarts,
        ckpt_dir=ckpt_dir,
        node_sizes=sizes,
    )
    archive_previous(run_dir)  # before this run writes anything in it
    if plan is not None:  # mixed-chip plan: checked against the launch, ranks assigned
        from argosy.runtime.mixed.launching import prepare
        from argosy.runtime.mixed.rebalance import RebalancePolicy

        policy = RebalancePolicy(enabled=rebalance)
        spec.extra_env.update(prepare(plan, emulate_chips, world, run_dir, policy))
    elif emulate_chips:
        raise ArgosyError("--emulate-chips needs --plan: the plan gives ranks their chips")
    # stop the ranks, clean up, then exit; SIGINT too, even where it came in ignored (a
    # launcher started in the background of a script, or by a process that ignores it)
    stopping = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _interrupt) for sig in stopping}
    try:
        try:
            _prove_shared_store(spec, config.store_probe_timeout_s)
        except KeyboardInterrupt:
            err_console.print("interrupted while the nodes proved their checkpoint store")
            raise typer.Exit(code=130) from None
        try:
            checked, config = _preflight(ctx, preflight, emulate_slow, nproc_per_node, config)
        except KeyboardInterrupt:
            err_console.print("interrupted during the preflight check; no rank was started")
            raise typer.Exit(code=130) from None
        if checked is not None:
            spec.extra_env.update(checked.env)
        policy = config_of(ctx).health.policy
        summary = _run(spec, injections, config, _total_steps(command), quiet, tee, checked, policy)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _report(summary, run_dir)
    if summary["status"] != "completed":
        raise typer.Exit(code=130 if summary["status"] == "interrupted" else 1)


def _prove_shared_store(spec, timeout_s: float) -> None:  # noqa: ANN001
    """Multi-node: every node writes a probe into the checkpoint store; node rank 0 waits
    until it sees them all, else the launch fails (exit 2) saying the store is not shared."""
    if spec.nnodes == 1:
        return
    import os

    from argosy.runtime import shared_store

    gang = shared_store.gang_id(os.environ, spec.master_addr, spec.master_port)
    shared_store.write_probe(spec.store, gang, spec.node_rank)
    if spec.node_rank == 0:
        with err_console.status(f"waiting for {spec.nnodes - 1} node(s) in {spec.store}"):
            shared_store.wait_for_nodes(spec.store, gang, spec.nnodes, timeout_s)


def _preflight(ctx, enabled, emulate_slow, need, config):  # noqa: ANN001, ANN202
    """Check the devices (when asked); spares used up by bad devices leave the config."""
    if not enabled:
        if emulate_slow:
            raise ArgosyError("--emulate-slow emulates a slow device for --preflight; add it")
        return None, config
    from argosy.health.throttle import parse_slow
    from argosy.runtime.preflight import run_preflight

    slow = parse_slow(emulate_slow, need + config.spares)
    with err_console.status(f"preflight: checking {need + config.spares} device(s)"):
        checked = run_preflight(config_of(ctx).health, need, config.spares, slow)
    spares_left = max(0, config.spares - checked.excluded)
    return checked, config.model_copy(update={"spares": spares_left})


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _runtime_config(ctx, max_restarts, hang_timeout, straggler_policy, spares):  # noqa: ANN001, ANN202
    from argosy.runtime.config import RuntimeConfig

    base = getattr(config_of(ctx), "runtime", None) or RuntimeConfig()
    update = {
        "max_restarts": max_restarts,
        "hang_floor_s": hang_timeout,
        "straggler_policy": straggler_policy,
        "spares": spares,
    }
    if straggler_policy not in (None, "warn", "restart"):
        raise ArgosyError(f"--straggler-policy '{straggler_policy}'; expected warn or restart")
    data = base.model_dump() | {k: v for k, v in update.items() if v is not None}
    config = RuntimeConfig.model_validate(data)
    if config.straggler_policy == "restart" and config.spares < 1:
        err_console.print(
            "note: --straggler-policy restart needs a spare device (--spares 1 or more); "
            "with none, a straggler is only warned about",
            highlight=False,
            markup=False,
        )
    return config


def _total_steps(command: list[str]) -> int | None:
    text = " ".join(command)
    match = re.search(r"--steps[= ](\d+)", text)
    return int(match.group(1)) if match else None


def _run(spec, injections, config, total, quiet, tee, checked, node_policy):  # noqa: ANN001, ANN202
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from argosy.runtime.agent import Agent
    from argosy.runtime.notices import notice

    def on_event(event: dict) -> None:
        line = notice(event, config.max_restarts)
        if line is not None:
            err_console.print(line, highlight=False, markup=False, soft_wrap=True)

    def on_rank_line(line: str) -> None:
        console.print(line, highlight=False, markup=False, soft_wrap=True)

    hooks = {
        "on_event": on_event,
        "on_rank_line": on_rank_line if tee else None,
        "preflight": checked.event if checked is not None else None,
        "node_policy": node_policy,
    }
    if quiet:
        return Agent(spec, injections, config, **hooks).run()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task("attempt 0", total=total)

        def on_progress(step: int, attempt: int) -> None:
            progress.update(task, completed=step, description=f"attempt {attempt}")

        return Agent(spec, injections, config, on_progress=on_progress, **hooks).run()


def _report(summary: dict, run_dir: Path) -> None:
    status = summary["status"]
    color = "green" if status == "completed" else "red"
    console.print(
        f"[{color}]{status}[/]: step {summary['final_step']}, loss {summary['final_loss']}, "
        f"effective training time {summary['effective_training_time']:.1%}, "
        f"{summary['restarts']} restart(s); details: argosy runs show {run_dir}",
        highlight=False,
    )
    cause = summary.get("cause")
    if cause:
        err_console.print(
            f"[bold red]cause:[/] {escape(str(cause['detail']))}", highlight=False, emoji=False
        )
        for rank, lines in cause.get("last_lines", {}).items():
            _quote_rank_lines(rank, lines)


def _quote_rank_lines(rank: object, lines: list[str]) -> None:
    """A rank's last lines, each indented under its header and never wrapped: the
    server reads an indented line under "rank N, last lines:" as the job's own words
    (`argosy.server.failures.quoted_lines`), so a wrapped tail would pass for the
    launcher's."""
    err_console.print(f"[bold]rank {rank}, last lines:[/]", highlight=False, soft_wrap=True)
    for line in lines:
        err_console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)


def _node_sizes(text: str | None, nnodes: int, node_rank: int, nproc: int) -> tuple[int, ...]:
    """`--node-sizes` as a tuple: one positive count per node, this node's = `nproc`."""
    if text is None:
        return ()
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ArgosyError(
            f"--node-sizes '{text}' is not a comma-separated list of counts"
        ) from None
    if len(sizes) != nnodes or min(sizes) < 1:
        raise ArgosyError(f"--node-sizes '{text}' needs {nnodes} positive counts (--nnodes)")
    if sizes[node_rank] != nproc:
        raise ArgosyError(
            f"--node-sizes '{text}' gives node rank {node_rank} {sizes[node_rank]} ranks; "
            f"--nproc-per-node says {nproc}"
        )
    return sizes
