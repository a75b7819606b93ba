"""`argosy ckpt ls|show|verify DIR`: inspect flash checkpoints on disk (and in memory).

argosy ckpt ls checkpoints/run1
argosy ckpt show checkpoints/run1 --step 120
argosy ckpt verify checkpoints/run1          # exit 1 when a step is torn
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from argosy.cli.common import console, err_console, print_error, print_json
from argosy.core.errors import ArgosyError

app = typer.Typer(help="Inspect flash checkpoints.", no_args_is_help=True)

DirArg = typer.Argument(..., help="The checkpoint directory (one step_* folder per step).")


def _directory(path: Path) -> Path:
    if not path.is_dir():
        raise ArgosyError(f"{path} is not a checkpoint directory (no such directory)")
    return path


def _step_number(name: str) -> int | None:
    """The step of a `step_<digits>` folder name; None for any other name."""
    from argosy.checkpoint import disk

    digits = name[len(disk.STEP_PREFIX) :]
    if not name.startswith(disk.STEP_PREFIX) or not digits.isdigit():
        return None
    return int(digits)


def _step_state(step_dir: Path) -> tuple[str, str | None, dict | None]:
    """(status, problem, manifest) of a committed step folder, by its manifest and the
    sizes of its files (cheap: no checksums; `ckpt verify` reads every byte)."""
    from argosy.checkpoint import disk

    if not (step_dir / disk.MANIFEST).exists():
        return "torn (no manifest)", f"{step_dir.name}: no {disk.MANIFEST}", None
    try:
        manifest = disk.read_manifest(step_dir)
        files = manifest["files"]
        problems = [disk.check_file(step_dir, n, want, full=False) for n, want in files.items()]
    except disk.TornCheckpointError as err:
        return "torn (unreadable manifest)", str(err), None
    except (AttributeError, KeyError, TypeError) as err:  # a manifest of the wrong shape
        return "torn (unreadable manifest)", f"{step_dir.name}: bad manifest ({err!r})", None
    problem = next((p for p in problems if p), None)
    if problem is None:
        return "complete", None, manifest
    kind = "missing file" if problem.endswith(": missing") else "truncated file"
    return f"torn ({kind})", problem, manifest


def _rows(directory: Path) -> list[dict]:
    """One row per step folder (committed or unfinished); other names are left out."""
    from argosy.checkpoint import commit

    rows = []
    for child in sorted(directory.iterdir()):
        step, problem, manifest = _step_number(child.name), None, None
        if step is not None and child.is_dir():
            status, problem, manifest = _step_state(child)
            epoch = (manifest or {}).get("epoch")
        elif (staged := commit.parse_tmp(child.name)) is not None:
            status, (step, epoch) = "unfinished", staged
        else:
            continue
        files = (manifest or {}).get("files", {})
        rows.append(
            {
                "step": step,
                "status": status,
                "problem": problem,
                "world_size": (manifest or {}).get("world_size"),
                "epoch": epoch,
                "bytes": sum(f["bytes"] for f in files.values()),
                "created": (manifest or {}).get("created_unix"),
                "path": str(child),
            }
        )
    return sorted(rows, key=lambda r: r["step"])


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
    table = Table(
        title=str(directory),
        caption="complete: manifest read, file sizes match; verify checks every checksum",
    )
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
    row = _pick_step(_directory(directory), step)
    step_dir, manifest = Path(row["path"]), _manifest_of(row)
    index = step_dir / f"rank{rank}.meta"
    if not index.exists():
        raise ArgosyError(
            f"{step_dir.name} has no rank {rank} (world size {manifest['world_size']})"
        )
    meta = _rank_meta(step_dir, rank)
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
    rows = [r for r in _rows(directory) if r["status"] != "unfinished"]
    if step is not None:
        rows = [r for r in rows if r["step"] == step]
        if not rows:
            raise ArgosyError(f"no step {step} in {directory}; {_complete_list(directory)}")
    steps = [Path(r["path"]) for r in rows]
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
        table.add_row(name, "ok" if not found else "[red]" + escape("; ".join(found)))
    console.print(table)
    if any(problems.values()):
        raise typer.Exit(code=1)


def _manifest_bytes(step_dir: Path) -> int:
    from argosy.checkpoint import disk

    try:
        return sum(f["bytes"] for f in disk.read_manifest(step_dir)["files"].values())
    except disk.TornCheckpointError:
        return 0


def _complete_list(directory: Path) -> str:
    steps = [str(r["step"]) for r in _rows(directory) if r["status"] == "complete"]
    return f"complete steps: {', '.join(steps) or 'none'}"


def _pick_step(directory: Path, step: int | None) -> dict:
    """The row of `step`, or of the newest complete step; a torn one is refused (exit 1)."""
    rows = [r for r in _rows(directory) if r["status"] != "unfinished"]
    if step is None:
        complete = [r for r in rows if r["status"] == "complete"]
        newest = complete[-1]["step"] if complete else -1
        for row in rows:
            if row["status"] != "complete" and row["step"] > newest:
                err_console.print(f"note: skipped {row['problem']}", markup=False, soft_wrap=True)
        if not complete:
            raise ArgosyError(f"{directory} holds no complete checkpoint step")
        return complete[-1]
    row = next((r for r in rows if r["step"] == step), None)
    if row is None:
        raise ArgosyError(f"no complete step {step} in {directory}; {_complete_list(directory)}")
    if row["status"] != "complete":
        print_error(f"step {step} is {row['status']}: {row['problem']}; run argosy ckpt verify")
        raise typer.Exit(1)
    return row


def _manifest_of(row: dict) -> dict:
    from argosy.checkpoint import disk

    return disk.read_manifest(Path(row["path"]))  # read and checked by _step_state


def _rank_meta(step_dir: Path, rank: int) -> Any:
    """One rank's index, checked against the manifest's checksum; a bad one exits 1."""
    import pickle

    from argosy.checkpoint import disk

    try:
        meta, _ = disk.read_index(step_dir, rank)
    except (disk.TornCheckpointError, OSError, pickle.UnpicklingError, ValueError) as err:
        print_error(f"rank {rank} of {step_dir.name} is unreadable: {err}; see argosy ckpt verify")
        raise typer.Exit(1) from None
    return meta


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
