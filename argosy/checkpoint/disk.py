"""Snapshots on disk in the torch.distributed.checkpoint (DCP) format: the file format.

One step is one directory, `step_<12 digits>/`, readable by `dcp.load` and DCP tooling:

    __<rank>_0.distcp     each rank's tensors and objects, torch.save records (DCP's format)
    .metadata             DCP's global Metadata (chunks of every tensor, where they lie)
    rank<r>.meta          argosy's per-rank index: layout, nesting, raw offsets (fast reload)
    manifest.json         written last: step, epoch, world size, size and crc32 of every file

This module writes one rank's files (fsynced, checksummed while written) and lists,
verifies and reads committed steps. How the ranks' files become one committed step (the
two-phase commit, fenced by epoch) is `commit.py`. A directory without a valid manifest,
or whose files fail their size or checksum, is torn and never loaded.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from argosy.checkpoint.crc import crc32

if TYPE_CHECKING:  # torch loads only where tensors are written or read (the CLI lists without it)
    import torch

    from argosy.checkpoint.layout import SnapshotMeta

MANIFEST = "manifest.json"
STEP_PREFIX = "step_"
_CHUNK = 32 << 20


class TornCheckpointError(Exception):
    """A step directory that must not be loaded; the message says what is wrong."""


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:012d}"


def data_file(rank: int) -> str:
    return f"__{rank}_0.distcp"


# -- writing one rank's files -----------------------------------------------------------


@dataclass
class RankPiece:
    """What one rank wrote: DCP write results, raw tensor offsets, file checksums."""

    rank: int
    items: list[tuple[Any, Any]]  # (MetadataIndex, _StorageInfo)
    raw_offsets: dict[str, int]
    files: dict[str, dict[str, int]]
    layout: bytes | None = None
    """The digest of its tensor part (records.Laid.digest), when it has one."""


def write_rank(
    staging: Path,
    meta: SnapshotMeta,
    data: memoryview,
    on_write: Callable[[int], None] | None = None,
    writers: int | None = None,
    below: int = 0,
    hurry: Callable[[], bool] | None = None,
    ready: Callable[[int], None] | None = None,
) -> RankPiece:
    """Write this rank's data file and index into `staging`, fsynced, checksummed.

    The file is laid out first (torch.save records that reference the snapshot's bytes,
    pwrite.py), then written by `writers` parallel threads in large aligned chunks; the
    index is written before it, and both are fsynced together (one journal commit).
    `on_write(bytes_so_far)` runs after every chunk written: progress for the watchdog,
    and the writer's fence (it raises to abandon the write). The caller publishes the
    returned piece (commit.py's done-marker) once this returns. `below`: nice levels
    under the caller's process for the threads that write, until `hurry()` (pwrite.py).
    `ready(n)`, when given, blocks until the first `n` bytes of `data` are in place (the
    snapshot is still landing in its slot): each chunk is written as soon as its bytes
    are there. The layout then must reference every tensor byte in `data`, never copy
    it; should torch.save ever copy one, the layout is made again once `data` is whole.
    """
    from argosy.checkpoint import fileplan, pwrite
    from argosy.checkpoint.records import lay_out

    name, index_name = data_file(meta.rank), f"rank{meta.rank}.meta"
    out = fileplan.FilePlan(source=data)
    laid = lay_out(out, meta, data, name)
    if ready is not None and out.source_bytes != sum(e.nbytes for e in meta.tensors):
        ready(data.nbytes)  # some bytes were copied at layout: wait, and lay out again
        out = fileplan.FilePlan(source=data)
        laid = lay_out(out, meta, data, name)
    index_bytes = pickle.dumps((meta, {"raw": laid.raw_offsets, "records": laid.records}))
    write_small(staging / index_name, index_bytes, sync=False)  # synced with the data
    paths = [staging / name, staging / index_name]  # synced together, while checksummed
    crc = pwrite.write_parallel(
        staging / name,
        out,
        writers,
        on_write=on_write,
        sync=lambda: sync_paths(paths),
        below=below,
        hurry=hurry,
        ready=ready,
    )
    files = {
        name: {"bytes": out.pos, "crc32": crc},
        index_name: {"bytes": len(index_bytes), "crc32": crc32(index_bytes)},
    }
    return RankPiece(meta.rank, laid.items, laid.raw_offsets, files, laid.digest)


def write_small(path: Path, payload: bytes, sync: bool = True) -> None:
    """Write `path` whole or not at all (a `.part` file renamed into place); fsynced before
    the rename when `sync` (else the caller syncs it, or its durability does not matter)."""
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_paths(paths: list[Path]) -> None:
    """fsync every file and directory of `paths`, all at once (a thread each), so the file
    system folds them into one journal commit; returns when all are durable, raises the
    first error."""
    if len(paths) == 1:
        fsync_dir(paths[0])  # fsync of a read-only descriptor: a file or a directory
        return
    with ThreadPoolExecutor(len(paths)) as pool:
        for done in [pool.submit(fsync_dir, path) for path in paths]:
            done.result()


# -- listing, checking, pruning, reading --------------------------------------------------


def committed_steps(directory: Path) -> list[int]:
    """Steps whose directory was moved into place (manifest present), oldest first."""
    if not directory.is_dir():
        return []
    steps = []
    for child in directory.iterdir():
        if child.name.startswith(STEP_PREFIX) and (child / MANIFEST).exists():
            try:
                steps.append(int(child.name[len(STEP_PREFIX) :]))
            except ValueError:
                continue
    return sorted(steps)


def read_manifest(step_dir: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((step_dir / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise TornCheckpointError(f"{step_dir.name}: unreadable manifest ({err})") from err
    if not isinstance(manifest, dict) or "files" not in manifest or "step" not in manifest:
        raise TornCheckpointError(f"{step_dir.name}: manifest lacks 'files' or 'step'")
    return manifest


def check_file(step_dir: Path, name: str, want: dict[str, int], full: bool = True) -> str | None:
    """What is wrong with one file (size, then checksum when `full`), or None."""
    path = step_dir / name
    try:
        size = path.stat().st_size
    except OSError:
        return f"{step_dir.name}/{name}: missing"
    if size != want["bytes"]:
        return f"{step_dir.name}/{name}: {size} bytes, manifest says {want['bytes']} (truncated?)"
    if full and file_crc(path) != want["crc32"]:
        return f"{step_dir.name}/{name}: checksum mismatch"
    return None


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            crc = crc32(chunk, crc)
    return crc


def verify(step_dir: Path) -> list[str]:
    """Every problem of a step directory (empty when it is complete and intact)."""
    try:
        manifest = read_manifest(step_dir)
    except TornCheckpointError as err:
        return [str(err)]
    problems = [check_file(step_dir, name, want) for name, want in manifest["files"].items()]
    return [p for p in problems if p]


def read_index(step_dir: Path, rank: int) -> tuple[SnapshotMeta, dict[str, Any]]:
    """(meta, offsets) of one rank from its checksummed index file."""
    manifest = read_manifest(step_dir)
    files = manifest["files"]
    index_name = f"rank{rank}.meta"
    if index_name not in files or data_file(rank) not in files:
        raise TornCheckpointError(f"{step_dir.name}: manifest lists no files of rank {rank}")
    index_bytes = (step_dir / index_name).read_bytes()
    if crc32(index_bytes) != files[index_name]["crc32"]:
        raise TornCheckpointError(f"{step_dir.name}/{index_name}: checksum mismatch")
    return pickle.loads(index_bytes)


def read_into(
    step_dir: Path, rank: int, meta: SnapshotMeta, offsets: dict[str, Any], dests: dict
) -> None:
    """Read the rank's tensors straight into `dests` (fqn -> contiguous CPU tensor).

    One sequential pass over the file: tensor bytes land in their destination, the bytes
    between them in a scratch buffer, and crc32 runs over both, in file order, in a helper
    thread. Raises TornCheckpointError (and `dests` must then be treated as garbage).
    """
    name = data_file(rank)
    want = read_manifest(step_dir)["files"][name]
    problem = check_file(step_dir, name, want, full=False)
    if problem:
        raise TornCheckpointError(problem)
    regions = sorted(
        (offsets["raw"][e.fqn], e.nbytes, dests[e.fqn]) for e in meta.tensors if e.nbytes
    )
    crc = [0]

    def update(chunk: Any) -> None:
        crc[0] = crc32(chunk, crc[0])

    with ThreadPoolExecutor(1) as pool, open(step_dir / name, "rb", buffering=0) as f:
        pos = 0
        for start, size, dest in [*regions, (want["bytes"], 0, None)]:
            if start > pos:
                gap = f.read(start - pos)
                pool.submit(update, gap)
                pos += len(gap)
            if dest is None:
                continue
            view = memoryview(dest.view(-1).view(__import__("torch").uint8).numpy())
            for at in range(0, size, _CHUNK):
                chunk = view[at : at + _CHUNK]
                got = f.readinto(chunk)
                if got != chunk.nbytes:
                    raise TornCheckpointError(f"{step_dir.name}/{name}: short read")
                pool.submit(update, chunk)
            pos += size
    if crc[0] != want["crc32"]:
        raise TornCheckpointError(f"{step_dir.name}/{name}: checksum mismatch")


def read_rank(step_dir: Path, rank: int) -> tuple[SnapshotMeta, torch.Tensor, dict[str, int]]:
    """(meta, the rank's data file as one uint8 tensor, offsets), checksums verified.

    The file is read once; its crc32 is computed in a helper thread while the next chunk
    is read. Raises TornCheckpointError naming what is wrong.
    """
    import torch

    manifest = read_manifest(step_dir)
    files = manifest["files"]
    index_name, name = f"rank{rank}.meta", data_file(rank)
    for fname in (index_name, name):
        if fname not in files:
            raise TornCheckpointError(f"{step_dir.name}: manifest has no {fname}")
    index_bytes = (step_dir / index_name).read_bytes()
    if crc32(index_bytes) != files[index_name]["crc32"]:
        raise TornCheckpointError(f"{step_dir.name}/{index_name}: checksum mismatch")
    meta, raw_offsets = pickle.loads(index_bytes)
    problem = check_file(step_dir, name, files[name], full=False)
    if problem:
        raise TornCheckpointError(problem)
    buffer = torch.empty(files[name]["bytes"], dtype=torch.uint8)
    crc = _read_with_crc(step_dir / name, buffer)
    if crc != files[name]["crc32"]:
        raise TornCheckpointError(f"{step_dir.name}/{name}: checksum mismatch")
    return meta, buffer, raw_offsets


def _read_with_crc(path: Path, buffer: torch.Tensor) -> int:
    view = memoryview(buffer.numpy()).cast("B")
    crc = [0]

    def update(chunk: memoryview) -> None:
        crc[0] = crc32(chunk, crc[0])

    with ThreadPoolExecutor(1) as pool, open(path, "rb", buffering=0) as f:
        pos = 0
        while pos < view.nbytes:
            chunk = view[pos : pos + _CHUNK]
            got = f.readinto(chunk)
            if not got:
                break
            pool.submit(update, chunk[:got])
            pos += got
    return crc[0]
