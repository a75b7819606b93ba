"""What a job user leaves on the machine besides processes: files in the shared temp
folders and SysV IPC objects, removed by that user itself once it has been idle here.

/dev/shm backs every tenant's flash checkpoints, and a SysV segment made 0666 is a
channel to every other tenant: neither ends with the processes that made them. (Where
attempts run in namespaces of their own, `argosy.executors.private_shm`, their /dev/shm
and SysV IPC go with them; /tmp remains, and this removes what is there.) Once a job
user has had no attempt here for `LEFTOVER_GRACE_S` (a restart after a fault comes within
seconds, and finds its warm process and /dev/shm snapshot), the local executor ends its
warm process and `LeftoverRemoval.start`s `python -m argosy.executors.leftovers` *as that
user* (`setpriv`, like its jobs; never as root). That process

- removes nothing while any other process on the machine has its uid as its real,
  effective or saved uid (a job of a second server here, a daemon that escaped where there
  are no cgroups): it exits `BUSY`, and is tried again after another grace period;
- removes the top-level entries of /dev/shm and /tmp it owns with
  `rm -rf --one-file-system` (iterative: any depth; a link itself, never its target). The
  kernel lets it do exactly what that user could have done: another user's files in a
  folder the job user made (a squatted /tmp/ray) stay;
- removes its SysV shared memory segments, semaphore sets and message queues (owner or
  creator its uid, as `/proc/sysvipc/*` lists them; `IPC_RMID`, which the kernel allows
  the owner or creator: a segment still attached goes once its last process detaches).

The server never waits for it: `reap`, at later polls, reads its exit and kills one still
running after `REMOVAL_DEADLINE_S`; an attempt of that user starting meanwhile kills it
first. Only for job users the server created (`cleanable`: an id in `isolation.JOB_IDS`
and the comment `isolation.JOB_USER_COMMENT`); never root, an account that existed before
(a `run_as` naming a person's account), or a job user made by a release before that
comment: those keep their files. Nothing of it is needed by a later attempt: a launch
frees what a killed one left in its own folder
(`argosy.checkpoint.segment.stale_run_segments`) and restores from disk instead.

What is idle lives in the server's memory: at its start a server counts every job user it
made on this machine as idle from then (`idle_from_now`), and the attempts it finds ended
count again (one started before `job.uid` was written counts by the owner of its output
log). POSIX message queues and /var/tmp are not
covered.

    removal = LeftoverRemoval()
    removal.ended(uid)                       # an attempt of uid ended here
    for uid in removal.due(busy={...}):      # idle for the grace period
        removal.start(uid)                   # as uid, not waited for
    removal.reap()                           # at each later poll

    python -m argosy.executors.leftovers [--folder DIR ...]   # what runs as the job user
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from argosy.core.trees import remove_trees
from argosy.executors.isolation import JOB_IDS, JOB_USER_COMMENT, JobUser, job_environment

log = logging.getLogger(__name__)

SHARED_FOLDERS = (Path("/dev/shm"), Path("/tmp"))
SYSVIPC = Path("/proc/sysvipc")
PROC = Path("/proc")
IPC_KINDS = {"shm": "shmid", "sem": "semid", "msg": "msqid"}
"""The files of /proc/sysvipc and the name of their id column."""
IPC_RMID = 0
LEFTOVER_GRACE_S = 60.0
"""How long a job user has had no attempt here before its leftovers go: a restart after a
fault comes sooner, and keeps its warm process and its /dev/shm snapshot."""
REMOVAL_DEADLINE_S = 300.0
"""How long a removal may run; a later poll kills it past that (what is left stays)."""
CANCEL_WAIT_S = 0.25
"""How long a start of the same user waits for a removal it killed to end."""
BUSY = 3
"""A removal's exit status when another process of its user runs: nothing was removed."""
REFUSED = 4
"""A removal's exit status when it runs as a user that is not `cleanable`."""


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


def cleanable(uid: int, lookup: Callable[[int], pwd.struct_passwd] = pwd.getpwuid) -> bool:
    """Whether `uid` is a job user the server created, whose leftovers may go: its id lies
    in `isolation.JOB_IDS` and its account has the comment `ensure_user` gives. An account
    that existed before (`run_as: alice`, a person's own uid, whatever its number) keeps
    its files: its /tmp is not argosy's to empty."""
    if uid not in JOB_IDS:
        return False
    try:
        return lookup(uid).pw_gecos == JOB_USER_COMMENT
    except KeyError:  # no such account (any more)
        return False


# What runs as the job user (`main`)


def status_uids(text: str) -> tuple[int, ...]:
    """The real, effective and saved uid a `/proc/<pid>/status` text names."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            with contextlib.suppress(ValueError):
                return tuple(int(part) for part in line.split()[1:4])
    return ()


def processes_of(uid: int, proc: Path = PROC, but: Collection[int] = ()) -> list[int]:
    """The processes (but those in `but`) whose real, effective or saved uid is `uid`."""
    found = []
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) in but:
            continue
        try:
            text = (proc / name / "status").read_text()
        except OSError:  # gone since
            continue
        if uid in status_uids(text):
            found.append(int(name))
    return found


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


def remove_own_leftovers(folders: Iterable[Path], sysvipc: Path = SYSVIPC) -> Removed:
    """Remove what this process's user left in `folders` and its SysV IPC objects, with
    this process's rights: run as that user (`main`), never as root."""
    uid, removed = os.getuid(), Removed()
    for folder in folders:
        removed.files += remove_trees(owned_entries(folder, uid))
    removed.ipc = [o for o in ipc_objects_of(uid, sysvipc) if remove_ipc(o)]
    return removed


def main(argv: list[str] | None = None) -> int:
    """Remove this user's leftovers (exit 0), unless another process of it runs (`BUSY`)
    or it is not a job user the server made (`REFUSED`, root included); says what in one
    JSON line."""
    parser = argparse.ArgumentParser(prog="python -m argosy.executors.leftovers")
    parser.add_argument("--folder", type=Path, action="append", help="default: /dev/shm, /tmp")
    parser.add_argument("--sysvipc", type=Path, default=SYSVIPC)
    args = parser.parse_args(argv)
    uid = os.getuid()
    if len(set(os.getresuid())) != 1 or not cleanable(uid):
        print(json.dumps({"refused": uid}))
        return REFUSED
    others = processes_of(uid, but={os.getpid()})
    if others:
        print(json.dumps({"busy": others[:8]}))
        return BUSY
    removed = remove_own_leftovers(args.folder or SHARED_FOLDERS, args.sysvipc)
    print(json.dumps({"files": len(removed.files), "ipc": len(removed.ipc)}))
    return 0


# What the server does


@dataclass
class _Removal:
    proc: subprocess.Popen[bytes]
    deadline_s: float
    killed: bool = False


class LeftoverRemoval:
    """When each job user's leftovers go, and the processes (as that user) that remove
    them; nothing here waits for one. `clock` is monotonic seconds."""

    def __init__(
        self,
        *,
        grace_s: float = LEFTOVER_GRACE_S,
        deadline_s: float = REMOVAL_DEADLINE_S,
        folders: Iterable[Path] = SHARED_FOLDERS,
        sysvipc: Path = SYSVIPC,
        clock: Callable[[], float] = time.monotonic,
        is_cleanable: Callable[[int], bool] = cleanable,
        accounts: Callable[[], list[pwd.struct_passwd]] = pwd.getpwall,
    ) -> None:
        self.grace_s, self.deadline_s = grace_s, deadline_s
        self.folders, self.sysvipc = tuple(folders), sysvipc
        self._clock, self._cleanable, self._accounts = clock, is_cleanable, accounts
        self._idle_since: dict[int, float] = {}  # uid -> when its last attempt here ended
        self._removing: dict[int, _Removal] = {}

    @property
    def removing(self) -> frozenset[int]:
        """The uids whose removal runs now."""
        return frozenset(self._removing)

    def ended(self, uid: int | None) -> None:
        """An attempt of `uid` ended here: its leftovers go `grace_s` after its last one
        (a job user the server made; None, the server's own user: never)."""
        if uid is not None and self._cleanable(uid):
            self._idle_since[uid] = self._clock()

    def idle_from_now(self, mine: Callable[[str], bool]) -> None:
        """A server starts: each job user it made on this machine (`mine(name)`) counts as
        idle from now (what the last server knew of them died with it); one whose attempt
        the new server adopts is busy until that attempt ends, and one with any process
        left here is found busy by its removal, which is then tried again later."""
        for entry in self._accounts():
            if mine(entry.pw_name):
                self.ended(entry.pw_uid)

    def started(self, uid: int | None) -> None:
        """An attempt of `uid` starts: nothing of it goes meanwhile (a removal under way is
        killed first, and waited for a moment)."""
        if uid is None:
            return
        self._idle_since.pop(uid, None)
        removal = self._removing.pop(uid, None)
        if removal is not None:
            _end(removal.proc, CANCEL_WAIT_S)

    def due(self, busy: Collection[int | None]) -> list[int]:
        """The uids idle for `grace_s` (none of `busy`, the uids of attempts running here)
        whose removal does not run yet."""
        now = self._clock()
        return [
            uid
            for uid, since in self._idle_since.items()
            if uid not in busy and uid not in self._removing and now - since >= self.grace_s
        ]

    def start(self, uid: int) -> None:
        """Start removing what `uid` left: `main` as that user, in a session of its own."""
        self._idle_since.pop(uid, None)
        try:
            proc = subprocess.Popen(
                self.command(uid),
                cwd="/",
                env=job_environment(os.environ, {}, home="/"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except (KeyError, OSError, subprocess.SubprocessError) as err:
            log.warning("cannot remove what uid %d left: %s", uid, err)
            return
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)  # read at its end, never waited on
        self._removing[uid] = _Removal(proc, self._clock() + self.deadline_s)

    def command(self, uid: int) -> list[str]:
        """The removal's command line: `main` run as the user `uid` (KeyError: none)."""
        entry = pwd.getpwuid(uid)
        user = JobUser(entry.pw_name, uid, entry.pw_gid)
        folders = [arg for folder in self.folders for arg in ("--folder", str(folder))]
        module = ["-s", "-m", "argosy.executors.leftovers"]  # (-s: no user site of its own)
        return [*user.setpriv(), sys.executable, *module, *folders, "--sysvipc", str(self.sysvipc)]

    def reap(self) -> None:
        """Read the exits of removals that ended (one that found its user busy is tried
        again after another grace period); kill those past their deadline."""
        now = self._clock()
        for uid, removal in list(self._removing.items()):
            code = removal.proc.poll()
            if code is None:
                if now >= removal.deadline_s and not removal.killed:
                    _kill(removal.proc)
                    removal.killed = True
                    log.warning(
                        "removing what uid %d left took over %.0f s: killed", uid, self.deadline_s
                    )
                continue
            del self._removing[uid]
            said = _output(removal.proc)
            if code == BUSY:
                self._idle_since[uid] = now
                log.debug("uid %d still has processes here (%s): its leftovers wait", uid, said)
            elif code == 0:
                _log_removed(uid, said)
            elif not removal.killed:
                log.warning("removing what uid %d left failed (exit %d): %s", uid, code, said)

    def close(self) -> None:
        """Kill the removals under way (what they had not removed stays)."""
        for removal in self._removing.values():
            _end(removal.proc, CANCEL_WAIT_S)
        self._removing.clear()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the removal's session (its `rm` too), while it is not reaped (so its pid is
    still its own)."""
    if proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)


def _end(proc: subprocess.Popen[bytes], wait_s: float) -> None:
    _kill(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait_s)
    _output(proc)


def _output(proc: subprocess.Popen[bytes]) -> str:
    """What the removal said (never blocks: its pipe is non-blocking), its pipe closed."""
    if proc.stdout is None or proc.stdout.closed:
        return ""
    try:
        data = proc.stdout.read(1 << 16) or b""
    except OSError:
        data = b""
    finally:
        proc.stdout.close()
    return data.decode(errors="replace").strip()


def _log_removed(uid: int, said: str) -> None:
    try:
        counts = json.loads(said.splitlines()[-1])
        files, ipc = int(counts["files"]), int(counts["ipc"])
    except (IndexError, KeyError, TypeError, ValueError):
        log.warning("removing what uid %d left: unexpected output %r", uid, said[-300:])
        return
    if files or ipc:
        log.info(
            "removed what uid %d left: %d top-level entries of the shared temp folders and"
            " %d SysV IPC objects",
            uid,
            files,
            ipc,
        )


if __name__ == "__main__":
    sys.exit(main())
