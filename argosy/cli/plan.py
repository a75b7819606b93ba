"""`argosy plan` and `argosy estimate`: the auto-parallel planner on the command line.

argosy plan            # planner.default_model on hardware.default_cluster
argosy plan --model llama3-405b --cluster h100:16384 --seq-len 8192 --global-batch 2048 --json
argosy plan --model llama3-70b --cluster a100:512+h100:512 --emit auto
argosy estimate --model gpt3-175b --cluster a100:1536 --parallel tp=8,pp=16,dp=12,mbs=1 --json
argosy estimate -m llama3-8b -c h100:64 -p tp=1,pp=1,dp=64,mbs=2,zero=3,compile=1 -f torchtitan

`--framework` (megatron-core by default, megatron-lm, deepspeed, torchtitan, pytorch) picks
the profile the cost model prices with; `--emit F` prices with F's profile and prints F's
launch (refusing, exit 1, with the reason when F cannot run the best plan); `--emit auto`
emits for the --framework (plain pytorch and mixed-chip plans: an `argosy launch --plan`
bundle).
`estimate` exits 1 when the layout does not fit, after printing the smallest fix.

Only light modules load here: no torch, ray or fastapi.
"""

from __future__ import annotations

import typer
from rich import box
from rich.table import Table

from argosy.cli.common import (
    config_of,
    console,
    err_console,
    print_error,
    print_json,
    usage_error,
)

MODEL_HELP = "Preset, HF config.json, YAML file, or layers=..,hidden=..,heads=..[,..]."
FRAMEWORK_HELP = "megatron-core (default) | megatron-lm | deepspeed | torchtitan | pytorch"
EMIT_HELP = (
    "megatron | torchtitan | deepspeed | argosy (an `argosy launch --plan` bundle) | auto "
    "(the --framework's); --emit F prices with F's profile"
)


def _inputs(ctx: typer.Context, model, cluster, nic_gbps, seq_len, global_batch):
    from argosy.hardware.loader import load_cluster
    from argosy.planner.models import load_model

    for flag, value in (("--model", model), ("--cluster", cluster)):
        if value is not None and not value.strip():
            raise usage_error(f"{flag} is empty; give a value or leave the option out")
    cfg = config_of(ctx)
    planner = getattr(cfg, "planner", None)
    spec = load_model(model or (planner.default_model if planner else "llama3-8b"))
    clus = load_cluster(cluster or cfg.hardware.default_cluster, nic_gbps=nic_gbps)
    seq = seq_len or (planner.seq_len if planner else 8192)
    gbs = global_batch or (planner.global_batch if planner else 512)
    top = planner.top_k if planner else 5
    return spec, clus, seq, gbs, top


def plan(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    cluster: str | None = typer.Option(None, "--cluster", "-c", help="Cluster shorthand or YAML."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Tokens per sequence."),
    global_batch: int | None = typer.Option(
        None, "--global-batch", min=1, help="Sequences per step."
    ),
    top: int | None = typer.Option(None, "--top", min=1, help="Plans to show."),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", help="Override NIC Gb/s per device."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    emit: str | None = typer.Option(None, "--emit", help=EMIT_HELP),
    framework: str | None = typer.Option(None, "--framework", "-f", help=FRAMEWORK_HELP),
) -> None:
    """Search parallel plans (TP/PP/VPP/DP/CP/EP, micro-batch, recompute, ZeRO) and rank them."""
    from argosy.planner.api import plan as run_plan

    fw, emitter = _framework_and_emitter(framework, emit)
    if emitter and as_json:
        raise usage_error(
            "--emit prints the framework's own format (the argosy bundle is JSON already); "
            "leave out --json, or leave out --emit for the plans as JSON"
        )
    spec, clus, seq, gbs, default_top = _inputs(
        ctx, model, cluster, nic_gbps, seq_len, global_batch
    )
    if as_json or emitter:
        result = run_plan(spec, clus, seq, gbs, top or default_top, framework=fw)
    else:
        result = _with_progress(run_plan, spec, clus, seq, gbs, top or default_top, fw)
    if emitter:
        if not result["plans"]:
            print_error(f"no plan fits: {result.get('fix', '')}")
            raise typer.Exit(1)
        _emit(emitter, result, spec, seq, gbs, clus, explicit=emit.strip().lower() != "auto")
        return
    if as_json:
        print_json(result)
    else:
        _print_plans(result, spec.describe(), clus.describe())
    if not result["plans"]:  # the same exit code with or without --json
        raise typer.Exit(1)


def estimate(
    ctx: typer.Context,
    parallel: str = typer.Option(
        ..., "--parallel", "-p", help="tp=..,pp=..,dp=..[,vpp,mbs,recompute,zero,cp,ep,sp]"
    ),
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    cluster: str | None = typer.Option(None, "--cluster", "-c", help="Cluster shorthand or YAML."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Tokens per sequence."),
    global_batch: int | None = typer.Option(
        None, "--global-batch", min=1, help="Sequences per step."
    ),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", help="Override NIC Gb/s per device."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    framework: str | None = typer.Option(None, "--framework", "-f", help=FRAMEWORK_HELP),
) -> None:
    """Predict step time, throughput, MFU and memory of one parallel configuration."""
    from dataclasses import replace

    from argosy.planner.api import estimate as run_estimate
    from argosy.planner.parallel import given_keys, parse_parallel

    fw = _framework(framework)
    spec, clus, seq, gbs, _ = _inputs(ctx, model, cluster, nic_gbps, seq_len, global_batch)
    layout = parse_parallel(parallel)
    if "flash" not in given_keys(parallel):
        layout = replace(layout, flash=fw.flash_attention)
    result = run_estimate(spec, clus, layout, seq, gbs, framework=fw)
    if as_json:
        print_json(result)
    else:
        _print_estimate(result, spec.describe(), clus.describe())
    if not result["feasible"]:
        raise typer.Exit(1)


BREAKDOWN_LABELS = {
    "compute": "compute s",
    "recompute": "recompute s",
    "tp": "exposed TP comm s",
    "cp": "exposed CP comm s",
    "ep": "exposed EP comm s",
    "pp": "pipeline send/recv s",
    "bubble": "pipeline bubble s",
    "dp": "exposed DP/ZeRO comm s",
    "optimizer": "optimizer step s",
    "overhead": "overhead s",
}


def _print_estimate(result: dict, model: str, cluster: str) -> None:
    pred = result["predicted"]
    table = Table(
        title=f"{model} on {cluster} ({result['framework']})",
        header_style="bold",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("share", justify="right")
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "hardware_tflops_per_gpu", "mfu"):
        table.add_row(key, f"{pred[key]:,.3f}", "")
    step = pred["step_time_s"]
    table.add_section()
    for key, sec in pred["breakdown_s"].items():
        table.add_row(BREAKDOWN_LABELS.get(key, key), f"{sec:.3f}", f"{sec / step:.0%}")
    table.add_section()
    for key, gib in pred["memory_gib"].items():
        table.add_row(f"{key} GiB", f"{gib:.2f}", "")
    table.add_row("memory per device GiB", f"{pred['memory_gib_per_device']:.2f}", "")
    if not result["feasible"]:
        table.add_section()
        table.add_row("[red]does not fit[/]", "; ".join(result["reasons"]), "")
        if result.get("fix"):
            table.add_row("smallest fix", result["fix"], "")
    console.print(table)
    verdict = "[green]fits[/]" if result["feasible"] else "[red]does not fit[/]"
    detail = "" if result["feasible"] else ": " + "; ".join(result["reasons"])
    fix = f"\n  smallest fix: {result['fix']}" if result.get("fix") else ""
    console.print(verdict + detail + fix, highlight=False)


def _framework(name: str | None):
    """The framework profile; an unknown name is a usage error listing the known ones."""
    from argosy.core.errors import ArgosyError
    from argosy.planner.frameworks import load_framework

    try:
        return load_framework(name)
    except ArgosyError as err:
        raise usage_error(str(err)) from None


def _framework_and_emitter(framework: str | None, emit: str | None):
    """The profile to price with and the emitter name: `--emit F` implies F's profile;
    `--emit auto` takes the --framework's emitter; a contradiction is a usage error."""
    from argosy.core.errors import ArgosyError
    from argosy.planner.emit import BUNDLE, emitter_of, emitters, framework_of

    if emit is None:
        return _framework(framework), None
    if emit.strip().lower() == "auto":
        fw = _framework(framework)
        return fw, emitter_of(fw.name)
    if emit.strip().lower() == BUNDLE:
        return _framework(framework), BUNDLE
    try:
        name = emitters.canonical(emit)
    except ArgosyError as err:
        raise usage_error(f"{err}; or {BUNDLE}, auto") from None
    fw = _framework(framework or framework_of(name))
    if emitter_of(fw.name) != name:
        raise usage_error(
            f"--emit {name} runs the plan under {framework_of(name)}, but --framework is "
            f"{fw.name}; drop --framework, or use --emit auto"
        )
    return fw, name


def _emit(emitter: str, result: dict, spec, seq: int, gbs: int, clus, explicit: bool) -> None:
    """Print the best plan for `emitter`. A mixed-chip plan runs only under `argosy launch
    --plan`: `--emit auto` prints its bundle, an explicit framework exits 1 saying why."""
    from argosy.planner.emit import BUNDLE, bundle, emitters
    from argosy.planner.parallel import Parallel
    from argosy.planner.readback import EmitRefusedError

    best = result["plans"][0]
    if best.get("groups") and emitter != BUNDLE and explicit:
        print_error(
            f"{emitter} cannot run this plan: a mixed-chip plan runs only under `argosy "
            "launch --plan`; use --emit argosy (or auto) for its bundle"
        )
        raise typer.Exit(1)
    if best.get("groups") or emitter == BUNDLE:
        if best.get("groups") and emitter != BUNDLE:
            err_console.print(
                f"[yellow]note:[/] a mixed-chip plan runs only under `argosy launch --plan`; "
                f"{emitter} cannot run it, so the bundle is printed",
                highlight=False,
            )
        typer.echo(bundle(result, cluster=clus))
        return
    try:
        text = emitters.get(emitter)(
            Parallel(**best["parallel"]), spec, seq_len=seq, global_batch=gbs
        )
    except EmitRefusedError as err:
        print_error(f"{emitter} cannot run this plan: {err}")
        raise typer.Exit(1) from None
    typer.echo(text)


def _with_progress(run, spec, clus, seq, gbs, top, framework):
    from rich.progress import Progress

    from argosy.planner.hetero import ROUNDS

    total = ROUNDS * len(clus.groups) if clus.is_mixed else 1
    with Progress(transient=True, console=console) as progress:
        task = progress.add_task(f"planning {spec.name} on {clus.describe()}", total=total)
        return run(
            spec,
            clus,
            seq,
            gbs,
            top,
            progress=lambda n: progress.advance(task, n),
            framework=framework,
        )


def _print_plans(result: dict, model: str, cluster: str) -> None:
    search = result["search"]
    if not result["plans"]:
        console.print(
            f"[red]no plan fits[/] {model} on {cluster}: {result.get('fix', '')}", highlight=False
        )
        alt = result.get("alternatives", {})
        if alt.get("plans"):
            title = f"best plans on {alt['devices']} of the devices, batch {result['global_batch']}"
            console.print(_plans_table(alt["plans"], title, None))
        raise typer.Exit(1)
    title = f"{model} on {cluster}, seq {result['seq_len']}, batch {result['global_batch']}"
    caption = (
        f"{search['candidates']:,} candidates priced in {search['seconds']:.2f} s "
        f"({result.get('framework', 'megatron-core')}); "
        "MFU = model FLOPs (no recompute) / dense bf16 peak"
    )
    console.print(_plans_table(result["plans"], title, caption))
    best = result["plans"][0]
    if "split" in best:
        console.print(f"  best plan splits the {best['split']} across chip types:", highlight=False)
    for group in best.get("groups", []):
        console.print(
            f"  {group['chip']}: {group['devices']} devices, layers {group['layers']}, "
            f"batch share {group['batch_share']}, "
            + (_short(group["parallel"]) if group.get("parallel") else "idle"),
            highlight=False,
        )
    if "mixed_efficiency" in result:
        console.print(f"  mixed-chip efficiency {result['mixed_efficiency']:.3f}", highlight=False)
    if result.get("batch_split") and result.get("plans"):
        console.print(f"  no batch split: {result['batch_split']}", highlight=False)


def _plans_table(entries: list[dict], title: str, caption: str | None) -> Table:
    """One row per layout; a mixed-chip plan has one row per chip group, named in `group`."""
    mixed = any(e.get("groups") for e in entries)
    table = Table(
        title=title,
        caption=caption,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ["#", *(["chip"] if mixed else []), "plan", "mbs", "recomp", "zero", "step s"]
    columns += ["tokens/s", *([] if mixed else ["TFLOP/s"]), "MFU", "GiB"]
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    for rank, entry in enumerate(entries, start=1):
        pred = entry["predicted"]
        totals = [f"{pred['step_time_s']:.3f}", _si(pred["tokens_per_s"])]
        totals += [] if mixed else [f"{pred['tflops_per_gpu']:.0f}"]
        totals += [f"{pred['mfu']:.1%}"]
        layouts = [g for g in entry.get("groups", []) if g.get("parallel")] or [entry]
        for row, layout in enumerate(layouts):
            p = layout["parallel"]
            gib = layout.get("memory_gib_per_device", pred["memory_gib_per_device"])
            name = [str(layout["chip"]).split("-")[0]] if mixed and "chip" in layout else []
            name = name or (["-"] if mixed else [])
            cells = [str(rank) if row == 0 else "", *name, _degrees(p), str(p["mbs"])]
            rec = _recompute(p)
            cells += [rec if ":" in rec else rec[:4], str(p["zero"])]
            cells += totals if row == 0 else [""] * len(totals)
            table.add_row(*cells, f"{gib:.1f}")
    return table


def _degrees(p: dict) -> str:
    """Parallel degrees above 1, e.g. 'tp8 pp4 dp32' ('dp1' on one device); 'etp1' where
    the routed experts stay whole under TP."""
    parts = [f"{k}{p[k]}" for k in ("tp", "pp", "vpp", "dp", "cp", "ep") if p[k] > 1]
    if p.get("etp") and p["etp"] != p["tp"]:
        parts.append(f"etp{p['etp']}")
    return " ".join(parts) or "dp1"


def _recompute(p: dict) -> str:
    from argosy.planner.parallel import recompute_label

    return recompute_label(p["recompute"], p.get("recompute_layers", 0))


def _si(value: float) -> str:
    """A compact count: 590.2k, 12.4M."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.1f}{suffix}"
    return f"{value:.0f}"


def _short(p: dict) -> str:
    rec = _recompute(p)
    keys = ("tp", "pp", "vpp", "dp", "cp", "mbs")
    return " ".join([*(f"{k}={p[k]}" for k in keys), f"recompute={rec}", f"zero={p['zero']}"])
