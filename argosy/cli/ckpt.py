"""`argosy ckpt ls|show|verify DIR`: inspect flash checkpoints on disk (and in memory).

argosy ckpt ls checkpoints/run1
argosy ckpt show checkpoints/run1 --step 120
argosy ckpt verify checkpoints/run1          # exit 1 when a step is torn
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from argosy.cli.common import console, print_json
from argosy.core.errors import ArgosyError

app = typer.Typer(help="Inspect flash checkpoints.", no_args_is_help=True)

DirArg = typer.Argument(..., help="The checkpoint directory (one step_* folder per step).")


def _directory(path: Path) -> Path:
    if not path.is_dir():
        raise ArgosyError(f"{path} is not a checkpoint directory (no such directory)")
    return path


def _rows(directory: Path) -> list[dict]:
    from argosy.checkpoint import commit, disk

    rows = []
    for child in sorted(directory.iterdir()):
        epoch = None
        if child.name.startswith(disk.STEP_PREFIX):
            status, manifest = "complete", None
            try:
                manifest = disk.read_manifest(child)
                epoch = manifest.get("epoch")
            except disk.TornCheckpointError:
                status = "torn (no manifest)"
        elif commit.parse_tmp(child.name) is not None:
            status, manifest = "unfinished", None
            epoch = commit.parse_tmp(child.name)[1]
        else:
            continue
        files = (manifest or {}).get("files", {})
        rows.append(
            {
                "step": int(child.name.rsplit("_", 1)[-1]),
                "status": status,
                "world_size": (manifest or {}).get("world_size"),
                "epoch": epoch,
                "bytes": sum(f["bytes"] for f in files.values()),
                "created": (manifest or {}).get("created_unix"),
                "path": str(child),
            }
        )
    return rows


def _memory_steps(directory: Path) -> dict[int, list[str]]:
    """Steps held in shared memory for this directory's default job, by step."""
    from argosy.checkpoint.flash import default_job
    from argosy.checkpoint.segment import Segment, SlotState, job_segments

    found: dict[int, list[str]] = {}
    for path in job_segments(default_job(directory.absolute())):
        try:
            seg = Segment.open(path)
        except (OSError, ValueError):
            continue
        head = seg.header()
        seg.close()
        if head is not None and head.state is SlotState.COMPLETE:
            found.setdefault(head.step, []).append(path.name)
    return found


@app.command("ls")
def ls(
    directory: Path = DirArg,
    as_json: bool = typer.Option(False, "--json", help="Print the steps as JSON."),
) -> None:
    """List the steps: complete, torn or unfinished, their size, and which are in memory."""
    rows = _rows(_directory(directory))
    memory = _memory_steps(directory)
    for row in rows:
        row["in_memory"] = row["step"] in memory
    if as_json:
        print_json(rows)
        return
    table = Table(title=str(directory))
    for col in ("step", "status", "ranks", "size", "created (UTC)", "in memory"):
        table.add_column(col, justify="right" if col in ("step", "ranks", "size") else "left")
    for row in rows:
        created = row["created"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(created)) if created else "-"
        table.add_row(
            str(row["step"]),
            row["status"],
            str(row["world_size"] or "-"),
            _size(row["bytes"]),
            when,
            "yes" if row["in_memory"] else "",
        )
    console.print(table)


@app.command("show")
def show(
    directory: Path = DirArg,
    step: int | None = typer.Option(None, "--step", help="The step (default: newest complete)."),
    rank: int = typer.Option(0, "--rank", help="Whose shard to list."),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """The manifest of one step and the tensors and objects of one rank."""
    import pickle

    from argosy.checkpoint import disk

    step_dir = _step_dir(_directory(directory), step)
    manifest = disk.read_manifest(step_dir)
    index = step_dir / f"rank{rank}.meta"
    if not index.exists():
        raise ArgosyError(
            f"{step_dir.name} has no rank {rank} (world size {manifest['world_size']})"
        )
    meta, _ = pickle.loads(index.read_bytes())
    tensors = [
        {
            "name": e.fqn,
            "dtype": str(e.dtype).replace("torch.", ""),
            "shape": list(e.shape),
            "global_shape": list(e.global_shape),
            "bytes": e.nbytes,
        }
        for e in meta.tensors
    ]
    objects = [{"name": o.fqn, "bytes": len(o.payload)} for o in meta.objects]
    if as_json:
        print_json({"manifest": manifest, "tensors": tensors, "objects": objects})
        return
    console.print(
        f"step {manifest['step']}  ranks {manifest['world_size']}  "
        f"{_size(sum(f['bytes'] for f in manifest['files'].values()))}  {step_dir}"
    )
    table = Table(title=f"rank {rank}: {len(tensors)} tensors, {len(objects)} objects")
    for col in ("name", "dtype", "shape", "global shape", "size"):
        table.add_column(col)
    for t in tensors:
        table.add_row(
            t["name"], t["dtype"], str(t["shape"]), str(t["global_shape"]), _size(t["bytes"])
        )
    for o in objects:
        table.add_row(o["name"], "object", "-", "-", _size(o["bytes"]))
    console.print(table)


@app.command("verify")
def verify(
    directory: Path = DirArg,
    step: int | None = typer.Option(None, "--step", help="Only this step (default: all)."),
) -> None:
    """Check every file of every step against its manifest (size and crc32); exit 1 if torn."""
    from rich.progress import BarColumn, Progress, TextColumn, TransferSpeedColumn

    from argosy.checkpoint import disk

    directory = _directory(directory)
    steps = (
        [_step_dir(directory, step)]
        if step is not None
        else [Path(r["path"]) for r in _rows(directory) if r["status"] != "unfinished"]
    )
    if not steps:
        raise ArgosyError(f"{directory} holds no checkpoint steps")
    problems: dict[str, list[str]] = {}
    total = sum(_manifest_bytes(s) for s in steps)
    columns = (TextColumn("{task.description}"), BarColumn(), TransferSpeedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("verifying", total=total or None)
        for step_dir in steps:
            progress.update(task, description=f"verifying {step_dir.name}")
            problems[step_dir.name] = disk.verify(step_dir)
            progress.advance(task, _manifest_bytes(step_dir))
    table = Table(title="verify")
    table.add_column("step")
    table.add_column("result")
    for name, found in problems.items():
        table.add_row(name, "ok" if not found else "[red]" + "; ".join(found))
    console.print(table)
    if any(problems.values()):
        raise typer.Exit(code=1)


def _manifest_bytes(step_dir: Path) -> int:
    from argosy.checkpoint import disk

    try:
        return sum(f["bytes"] for f in disk.read_manifest(step_dir)["files"].values())
    except disk.TornCheckpointError:
        return 0


def _step_dir(directory: Path, step: int | None) -> Path:
    from argosy.checkpoint import disk

    steps = disk.committed_steps(directory)
    if step is None:
        if not steps:
            raise ArgosyError(f"{directory} holds no complete checkpoint step")
        step = steps[-1]
    elif step not in steps:
        known = ", ".join(str(s) for s in steps) or "none"
        raise ArgosyError(f"no complete step {step} in {directory}; complete steps: {known}")
    return directory / disk.step_dir_name(step)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
