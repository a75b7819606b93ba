"""The two-phase commit of one step across ranks, fenced by epoch.

Phase 1 (every rank): the coordinator (rank 0's persister) announces a step by creating
its staging directory `.tmp-e<epoch>-step_<12 digits>/`; each rank that still holds that
snapshot writes its shard there (fsynced, crc32 computed while it syncs) and publishes
`rank<r>.done` (its files with sizes and checksums; rank 0 keeps its own in memory). A
rank that no longer holds the step writes `rank<r>.skip`; a rank whose write failed
writes `rank<r>.failed`.

Phase 2 (coordinator): once every rank's done-marker is there and every file has the size
it announced, it writes `.metadata` and `manifest.json` (every file with its checksum, and
the epoch), fsyncs, and renames the directory to `step_<12 digits>` in one `rename`. A skip,
a failure or a timeout aborts the step for all: `aborted` is written and the directory is
removed; the previous commit stays the newest.

Durable operations, in order (each line waits for the one before; the paths on one line
are synced at once, which the file system folds into one journal commit):

    every rank   fsync(data file, rank index)            then the done-marker (not synced)
    rank 0       fsync(.metadata, manifest, staging dir)  then rename under the fence lock
    rank 0       fsync(checkpoint dir)                    then the step is announced durable

So everything the manifest names is durable before the rename makes the step visible, and
the rename is durable before anyone is told. A crash (or power loss) anywhere before the
rename leaves a staging directory that is never read; after it, a whole step. Readers
check every file against the manifest's checksum in any case.

Fencing: every attempt of a job has an epoch (the launcher's, else agreed at start, see
`flash.py`), higher than the ones before. A new attempt raises `.fence` to its epoch before
it lists what is committed; a writer whose epoch is below the fence stops writing, and a
commit re-reads the fence under the same lock before its rename. Staging paths carry the
epoch, so a writer of an earlier attempt can only ever touch its own attempt's files, and
no commit of an earlier attempt lands after a newer attempt has looked at the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import re
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from argosy.checkpoint import faultpoints
from argosy.checkpoint.disk import (
    MANIFEST,
    RankPiece,
    committed_steps,
    fsync_dir,
    step_dir_name,
    sync_paths,
    verify,
    write_small,
)

if TYPE_CHECKING:
    from argosy.checkpoint.layout import SnapshotMeta

TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
FENCE_FILE = ".fence"
ABORTED = "aborted"
METADATA = ".metadata"
FORMAT = "argosy-flash/2 (torch.distributed.checkpoint)"
_TMP = re.compile(r"\.tmp-e(\d+)-step_(\d+)$")


class FencedError(Exception):
    """A newer attempt has fenced this writer out: its writes and commits are void."""


def tmp_dir_name(step: int, epoch: int) -> str:
    return f"{TMP_PREFIX}e{epoch}-step_{step:012d}"


def parse_tmp(name: str) -> tuple[int, int] | None:
    """(step, epoch) of a staging directory name, or None."""
    match = _TMP.match(name)
    return (int(match.group(2)), int(match.group(1))) if match else None


def staging_dirs(directory: Path, epoch: int | None = None) -> dict[int, Path]:
    """Staging directories by step (of `epoch` only, when given)."""
    if not directory.is_dir():
        return {}
    found = {}
    for child in directory.iterdir():
        parsed = parse_tmp(child.name)
        if parsed is not None and (epoch is None or parsed[1] == epoch):
            found[parsed[0]] = child
    return found


# -- the fence ------------------------------------------------------------------------


class Fence:
    """`<directory>/.fence`: the newest epoch that may write; raised under an exclusive lock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FENCE_FILE
        self._cached = -1
        self._checked = 0.0

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / (FENCE_FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def current(self) -> int:
        try:
            return int(json.loads(self.path.read_text())["epoch"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    def raise_to(self, epoch: int) -> int:
        """Make `epoch` the newest that may write (never lowers it); returns the fence."""
        with self.locked():
            now = self.current()
            if epoch > now:
                write_small(self.path, json.dumps({"epoch": epoch, "unix": time.time()}).encode())
                now = epoch
        return now

    def fenced(self, epoch: int, max_age_s: float = 0.1) -> bool:
        """Whether a newer epoch has started (the file is re-read at most every `max_age_s`)."""
        if self._cached > epoch:
            return True
        now = time.monotonic()
        if now - self._checked >= max_age_s:
            self._cached, self._checked = self.current(), now
        return self._cached > epoch

    def check(self, epoch: int) -> None:
        if self.fenced(epoch):
            raise FencedError(f"epoch {epoch} is fenced by epoch {self._cached}")


# -- markers of phase 1 ---------------------------------------------------------------


def publish(staging: Path, piece: RankPiece, epoch: int) -> None:
    """This rank's shard is durable: its done-marker, naming its files and checksums.

    The marker itself is not fsynced: it tells rank 0 that the files it names are durable
    (they were synced before it), and rank 0's manifest, which is synced, repeats them.
    After a power loss a staging directory is garbage, marker or not."""
    write_small(staging / f"rank{piece.rank}.done", pickle.dumps((epoch, piece)), sync=False)


def refuse(staging: Path, rank: int, kind: str, reason: str) -> None:
    """`kind` is "skip" (the snapshot is gone) or "failed" (the write failed)."""
    with contextlib.suppress(OSError):  # the directory may be gone: the step is void anyway
        write_small(staging / f"rank{rank}.{kind}", reason.encode(), sync=False)


@dataclass
class Collected:
    """What the coordinator found in a staging directory."""

    pieces: list[RankPiece] | None
    """Every rank's piece, in rank order, once all are there."""
    refusal: tuple[str, str] | None
    """(kind, reason) when a rank refused the step: kind "skip" or "failed"; else None."""
    bytes_seen: int
    """Bytes in the staging directory (progress while waiting for the other ranks)."""


def collect(staging: Path, world_size: int, epoch: int, own: RankPiece | None = None) -> Collected:
    """One non-blocking look at the staging directory. `own`: the caller's piece, which it
    holds (rank 0 publishes none: its marker would only be read back by itself)."""
    for rank in range(world_size):
        for kind in ("failed", "skip"):
            marker = staging / f"rank{rank}.{kind}"
            if marker.exists():
                reason = marker.read_text(errors="replace")
                return Collected(None, (kind, f"rank {rank} refused it ({kind}): {reason}"), 0)
    seen = 0
    with contextlib.suppress(OSError):
        seen = sum(p.stat().st_size for p in staging.iterdir())
    mine = None if own is None else own.rank
    done = [staging / f"rank{r}.done" for r in range(world_size) if r != mine]
    if not all(p.exists() for p in done):
        return Collected(None, None, seen)
    pieces = [] if own is None else [own]
    for path in done:
        got_epoch, piece = pickle.loads(path.read_bytes())
        if got_epoch != epoch:
            why = f"{path.name} is of epoch {got_epoch}, not {epoch}"
            return Collected(None, ("failed", why), seen)
        pieces.append(piece)
    return Collected(sorted(pieces, key=lambda p: p.rank), None, seen)


def abort(staging: Path, reason: str) -> None:
    """Mark the step void for every rank, then remove its directory."""
    with contextlib.suppress(OSError):
        write_small(staging / ABORTED, reason.encode(), sync=False)
    shutil.rmtree(staging, ignore_errors=True)


def aborted(staging: Path) -> bool:
    return (staging / ABORTED).exists() or not staging.is_dir()


# -- phase 2 ----------------------------------------------------------------------------


def commit(
    directory: Path,
    step: int,
    epoch: int,
    metas: list[SnapshotMeta],
    pieces: list[RankPiece],
    fence: Fence,
) -> Path | None:
    """Write `.metadata` and the manifest, then rename the step into place atomically.

    Returns the step directory, or None when that step was committed already (by an
    earlier attempt): the staging copy is dropped. Raises FencedError when a newer
    epoch has started, and TornCheckpointError-like ValueError when a file lacks bytes.
    """
    staging = directory / tmp_dir_name(step, epoch)
    files: dict[str, dict[str, int]] = {}
    for piece in pieces:
        for name, want in piece.files.items():
            size = (staging / name).stat().st_size
            if size != want["bytes"]:
                raise ValueError(f"{name}: {size} bytes, rank {piece.rank} wrote {want['bytes']}")
        files.update(piece.files)
    metadata_bytes = dcp_metadata_bytes(metas, pieces)
    write_small(staging / METADATA, metadata_bytes, sync=False)
    files[METADATA] = {"bytes": len(metadata_bytes), "crc32": zlib.crc32(metadata_bytes)}
    manifest = {
        "format": FORMAT,
        "step": step,
        "epoch": epoch,
        "world_size": len(pieces),
        "created_unix": time.time(),
        "files": files,
    }
    write_small(staging / MANIFEST, json.dumps(manifest, indent=1).encode(), sync=False)
    for piece in pieces:
        (staging / f"rank{piece.rank}.done").unlink(missing_ok=True)
    faultpoints.reach("metadata")
    # the shards and indexes were synced by their ranks: the two files and the directory's
    # entries are all that is left, synced at once, before anything can see the step
    sync_paths([staging / METADATA, staging / MANIFEST, staging])
    faultpoints.reach("commit")
    final = directory / step_dir_name(step)
    with fence.locked():
        if fence.current() > epoch:
            raise FencedError(f"epoch {epoch} fenced before the commit of step {step}")
        try:
            os.rename(staging, final)  # fails when `final` exists and is not empty
        except OSError:
            if not (final / MANIFEST).exists():
                raise
            if not verify(final):  # committed already, and intact: ours is a copy
                shutil.rmtree(staging, ignore_errors=True)
                return None
            _replace_torn(directory, final, staging)
        fsync_dir(directory)
    return final


def _replace_torn(directory: Path, final: Path, staging: Path) -> None:
    """A step committed earlier whose files are torn now: this whole copy takes its place
    (the torn one is renamed away first, so the step is never half of each)."""
    trash = directory / f"{TRASH_PREFIX}{final.name}-torn-{os.getpid()}-{time.time_ns()}"
    os.rename(final, trash)
    os.rename(staging, final)
    shutil.rmtree(trash, ignore_errors=True)


_memo: tuple[tuple, bytes] | None = None
"""(key, pickled Metadata) of this process's last commit (`dcp_metadata_bytes`)."""


def dcp_metadata_bytes(metas: list[SnapshotMeta], pieces: list[RankPiece]) -> bytes:
    """DCP's `.metadata` of one step, pickled; the last one again when nothing it derives
    from changed (1,024 tensors: 8 ms to build and pickle, which a save of the same
    tensors then skips). The key: every rank's layout digest (its tensor entries and
    their items, records.py), rank 0's object items and the state's nesting."""
    global _memo
    key = _metadata_key(metas, pieces)
    if key is not None and _memo is not None and _memo[0] == key:
        return _memo[1]
    payload = pickle.dumps(_dcp_metadata(metas, pieces))
    if key is not None:
        _memo = (key, payload)
    return payload


def _metadata_key(metas: list[SnapshotMeta], pieces: list[RankPiece]) -> tuple | None:
    layouts = tuple(piece.layout for piece in pieces)
    if None in layouts or [p.rank for p in pieces] != list(range(len(metas))):
        return None
    names = {obj.fqn for obj in metas[0].objects}
    objects = tuple(
        (index.fqn, info.relative_path, info.offset, info.length)
        for index, info in pieces[0].items
        if index.fqn in names
    )
    return layouts, objects, pickle.dumps(metas[0].mappings)


def _dcp_metadata(metas: list[SnapshotMeta], pieces: list[RankPiece]) -> Any:
    import torch
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    state: dict[str, Any] = {}
    for meta in metas:
        for e in meta.tensors:
            if meta.rank != 0 and not e.sharded:
                continue
            md = state.setdefault(
                e.fqn,
                TensorStorageMetadata(
                    TensorProperties(dtype=e.dtype), torch.Size(e.global_shape), []
                ),
            )
            md.chunks.append(ChunkStorageMetadata(torch.Size(e.global_offset), torch.Size(e.shape)))
        if meta.rank == 0:
            for obj in meta.objects:
                state[obj.fqn] = BytesStorageMetadata()
    storage = {index: info for piece in pieces for index, info in piece.items}
    return Metadata(
        state_dict_metadata=state,
        planner_data=_dcp_paths(metas[0].mappings),
        storage_data=storage,
        version=CURRENT_DCP_VERSION,
    )


def _dcp_paths(paths: dict[str, tuple]) -> dict[str, tuple]:
    """DCP's own path form (dict keys as str, list positions as int): no argosy types."""
    return {
        fqn: tuple(int(p) if type(p).__name__ == "_Index" else str(p) for p in path)
        for fqn, path in paths.items()
    }


def prune(directory: Path, keep: int, epoch: int) -> list[int]:
    """Remove committed steps beyond the newest `keep`, and staging directories that can
    never commit: of earlier epochs, aborted, or not newer than the newest commit."""
    steps = committed_steps(directory)
    doomed = steps[:-keep] if keep > 0 else []
    for step in doomed:  # renamed away first: a step is whole or gone, never half-deleted
        trash = directory / f"{TRASH_PREFIX}{step_dir_name(step)}-{os.getpid()}"
        with contextlib.suppress(OSError):
            os.rename(directory / step_dir_name(step), trash)
    newest = steps[-1] if steps else -1
    for child in directory.iterdir() if directory.is_dir() else []:
        if child.name.startswith(TRASH_PREFIX):
            shutil.rmtree(child, ignore_errors=True)
            continue
        parsed = parse_tmp(child.name)
        if parsed is None:
            continue
        step, its_epoch = parsed
        if its_epoch < epoch or step <= newest or (child / ABORTED).exists():
            shutil.rmtree(child, ignore_errors=True)
    return doomed
