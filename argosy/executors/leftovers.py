"""What a job user leaves on the machine besides processes: files in the shared temp
folders and SysV IPC objects, removed once that user's last attempt here has ended.

/dev/shm backs every tenant's flash checkpoints, and a SysV segment made 0666 is a
channel to every other tenant: neither ends with the processes that made them. When no
attempt of a job user runs on this machine any more, `remove_leftovers` removes

- the top-level entries of /dev/shm and /tmp that user owns (a folder with all it
  holds; a link itself, never what it points to), and
- its SysV shared memory segments, semaphore sets and message queues (owner or creator
  that user, as `/proc/sysvipc/*` lists them; `IPC_RMID` through libc: a segment still
  attached goes once its last process detaches).

Only for job users the server created (`cleanable`: their ids lie in
`isolation.JOB_IDS`); never root, the server's own user, or an account that existed
before (a `run_as` naming a person's account keeps that person's files). Nothing of it is
needed by a later attempt: a launch frees what a killed one left in its own folder
(`argosy.checkpoint.segment.stale_run_segments`) and restores from disk instead.

    removed = remove_leftovers(user.uid)
    removed.files, removed.ipc       # what went
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from argosy.executors.isolation import JOB_IDS

SHARED_FOLDERS = (Path("/dev/shm"), Path("/tmp"))
SYSVIPC = Path("/proc/sysvipc")
IPC_KINDS = {"shm": "shmid", "sem": "semid", "msg": "msqid"}
"""The files of /proc/sysvipc and the name of their id column."""
IPC_RMID = 0


@dataclass(frozen=True)
class IpcObject:
    """One SysV IPC object: `kind` shm, sem or msg; its id; its owner and creator."""

    kind: str
    id: int
    uid: int
    cuid: int


@dataclass
class Removed:
    files: list[Path] = field(default_factory=list)
    ipc: list[IpcObject] = field(default_factory=list)


def cleanable(uid: int) -> bool:
    """Whether `uid` is a job user the server created, whose leftovers may go: its ids
    lie in `isolation.JOB_IDS`. An account that existed before (`run_as: alice`, a
    person's own uid) keeps its files: its /tmp is not argosy's to empty."""
    return uid in JOB_IDS and uid != os.geteuid()


def parse_sysvipc(kind: str, text: str) -> list[IpcObject]:
    """The objects a `/proc/sysvipc/<kind>` text lists (its header names the columns)."""
    lines = text.splitlines()
    if not lines:
        return []
    header = lines[0].split()
    try:
        at = {name: header.index(name) for name in (IPC_KINDS[kind], "uid", "cuid")}
    except ValueError:
        return []
    found = []
    for line in lines[1:]:
        cols = line.split()
        try:
            ids = {name: int(cols[i]) for name, i in at.items()}
        except (IndexError, ValueError):
            continue
        found.append(IpcObject(kind, ids[IPC_KINDS[kind]], ids["uid"], ids["cuid"]))
    return found


def ipc_objects_of(uid: int, sysvipc: Path = SYSVIPC) -> list[IpcObject]:
    """The SysV IPC objects `uid` owns or created."""
    found = []
    for kind in IPC_KINDS:
        try:
            text = (sysvipc / kind).read_text()
        except OSError:
            continue
        found += [o for o in parse_sysvipc(kind, text) if uid in (o.uid, o.cuid)]
    return found


def remove_ipc(obj: IpcObject) -> bool:
    """`IPC_RMID` on the object; True when it is gone (already gone counts)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ipc_id, rmid = ctypes.c_int(obj.id), ctypes.c_int(IPC_RMID)
    if obj.kind == "sem":  # semctl(semid, semnum, cmd)
        done = libc.semctl(ipc_id, ctypes.c_int(0), rmid)
    else:  # shmctl / msgctl(id, cmd, buf)
        call = libc.shmctl if obj.kind == "shm" else libc.msgctl
        done = call(ipc_id, rmid, ctypes.c_void_p(None))
    if done == 0:
        return True
    return ctypes.get_errno() in (errno.EINVAL, errno.EIDRM)  # no such id (any more)


def owned_entries(folder: Path, uid: int) -> list[Path]:
    """The top-level entries of `folder` that `uid` owns, links by their own owner
    (never followed)."""
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        with contextlib.suppress(OSError):
            if os.lstat(folder / name).st_uid == uid:
                found.append(folder / name)
    return found


def remove_entry(path: Path, uid: int) -> bool:
    """Remove `path` if `uid` still owns it: a folder with everything in it (by file
    descriptors, links inside not followed), anything else unlinked (a link itself)."""
    try:
        info = os.lstat(path)
        if info.st_uid != uid:
            return False
        if stat.S_ISDIR(info.st_mode):  # fd-based on Linux: safe against links swapped in
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        return False
    return not os.path.lexists(path)


def remove_leftovers(
    uid: int,
    folders: Iterable[Path] = SHARED_FOLDERS,
    sysvipc: Path = SYSVIPC,
) -> Removed:
    """Remove what `uid` left in `folders` and its SysV IPC objects (nothing at all when
    `uid` is not `cleanable`). Call it only once no process of `uid` runs here."""
    removed = Removed()
    if not cleanable(uid):
        return removed
    for folder in folders:
        removed.files += [p for p in owned_entries(folder, uid) if remove_entry(p, uid)]
    removed.ipc = [o for o in ipc_objects_of(uid, sysvipc) if remove_ipc(o)]
    return removed
