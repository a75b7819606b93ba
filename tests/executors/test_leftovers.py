"""What a job user leaves besides processes (files in /dev/shm and /tmp, SysV IPC objects)
goes once its last attempt on the machine has ended; never another user's, never through
a link. The parsing and the choice run everywhere; owning files as other users and
making IPC objects as them needs root."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from argosy.executors.base import LaunchRequest
from argosy.executors.isolation import JOB_IDS, JobIdentity, id_taken, planned_id
from argosy.executors.leftovers import (
    IpcObject,
    cleanable,
    ipc_objects_of,
    owned_entries,
    parse_sysvipc,
    remove_leftovers,
)

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="files and IPC of other users need root")

SHM = """\
       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap
1589707344         12   666              16777216  4242  4242      0 20031 20031 20031 20031          0          0 1764300000              16777216                     0
         0         13   600                  4096  4243  4243      1     0     0 20031 20031          0          0 1764300001                  4096                     0
"""  # noqa: E501  (the kernel's own line length)
SEM = """\
       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime
         0          3   600          1  1000  1000  1000  1000          0 1764300000
"""
MSG = """\
       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime
         0          7   666           0          0     0     0 20031 20031 20031 20031          0          0 1764300000
"""  # noqa: E501


def test_sysvipc_tables_are_read_by_their_header() -> None:
    assert parse_sysvipc("shm", SHM) == [
        IpcObject("shm", 12, 20031, 20031),
        IpcObject("shm", 13, 0, 20031),  # given to root by its creator: still the job's
    ]
    assert parse_sysvipc("sem", SEM) == [IpcObject("sem", 3, 1000, 1000)]
    assert parse_sysvipc("msg", MSG) == [IpcObject("msg", 7, 20031, 20031)]
    assert parse_sysvipc("shm", "") == [] and parse_sysvipc("shm", "key junk\n1 2\n") == []


def test_the_objects_of_a_user_are_those_it_owns_or_made(tmp_path: Path) -> None:
    for kind, text in (("shm", SHM), ("sem", SEM), ("msg", MSG)):
        (tmp_path / kind).write_text(text)
    got = {(o.kind, o.id) for o in ipc_objects_of(20031, tmp_path)}
    assert got == {("shm", 12), ("shm", 13), ("msg", 7)}


@pytest.mark.parametrize(
    ("uid", "want"),
    [
        (0, False),
        (os.geteuid(), False),
        (65534, False),
        (999, False),
        (1000, False),
        (JOB_IDS.start - 1, False),
        (JOB_IDS.start, True),
        (20031, True),
        (JOB_IDS.stop - 1, True),
        (JOB_IDS.stop, False),
    ],
    ids=[
        "root",
        "server-user",
        "nobody",
        "system",
        "person",
        "below",
        "first",
        "job",
        "last",
        "past",
    ],
)
def test_only_job_users_the_server_created_are_cleaned(uid: int, want: bool) -> None:
    assert cleanable(uid) == want


def _free_uid() -> int:
    return planned_id(f"argosy-left-{uuid.uuid4().hex[:8]}", id_taken)


@ROOT_ONLY
def test_a_user_s_top_level_entries_go_and_nothing_else(tmp_path: Path) -> None:
    """Its files, folders (with all they hold) and links go; a link's target, another
    user's entries and entries below another user's folder stay."""
    uid, other = _free_uid(), _free_uid() + 1
    shared = tmp_path / "shm"
    shared.mkdir()
    keep = tmp_path / "keep"
    keep.mkdir()
    target = keep / "root-file"
    target.write_text("root's")
    made = {
        "file": shared / "f",
        "folder": shared / "d",
        "link-to-root-file": shared / "l",
        "link-to-root-folder": shared / "ld",
    }
    made["file"].write_text("x")
    made["folder"].mkdir()
    (made["folder"] / "inner").write_text("y")
    made["link-to-root-file"].symlink_to(target)
    made["link-to-root-folder"].symlink_to(keep)
    for path in made.values():
        os.lchown(path, uid, uid)
    os.lchown(made["folder"] / "inner", uid, uid)
    others = shared / "other"
    others.write_text("z")
    os.chown(others, other, other)
    roots = shared / "roots"
    roots.mkdir()
    (roots / "under-root").write_text("w")
    os.lchown(roots / "under-root", uid, uid)  # the job's file in root's folder: not top level

    assert sorted(owned_entries(shared, uid)) == sorted(made.values())
    removed = remove_leftovers(uid, folders=[shared], sysvipc=tmp_path / "none")
    assert sorted(removed.files) == sorted(made.values())
    assert sorted(p.name for p in shared.iterdir()) == ["other", "roots"]
    assert target.read_text() == "root's" and sorted(p.name for p in keep.iterdir()) == [
        "root-file"
    ]
    assert (roots / "under-root").exists()


@ROOT_ONLY
def test_root_s_and_the_server_s_entries_are_never_touched(tmp_path: Path) -> None:
    (tmp_path / "mine").write_text("x")
    removed = remove_leftovers(os.geteuid(), folders=[tmp_path])
    assert removed.files == [] and (tmp_path / "mine").exists()


MAKE_IPC = """\
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
shm = libc.shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0o666)
sem = libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o666)
msg = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o666)
assert min(shm, sem, msg) >= 0, ctypes.get_errno()
print(shm, sem, msg)
"""


def _ipc_ids(kind: str) -> set[int]:
    return {o.id for o in parse_sysvipc(kind, Path(f"/proc/sysvipc/{kind}").read_text())}


@ROOT_ONLY
@pytest.mark.skipif(not Path("/proc/sysvipc/shm").exists(), reason="no /proc/sysvipc")
def test_a_user_s_sysv_objects_are_removed(tmp_path: Path) -> None:
    """A segment (mode 0666, as in the finding), a semaphore set and a message queue made
    by a test uid go; root's own segment stays."""
    uid = _free_uid()
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    made = subprocess.run(
        [*as_uid, sys.executable, "-c", MAKE_IPC], capture_output=True, text=True, check=True
    ).stdout.split()
    shm, sem, msg = map(int, made)
    libc = ctypes.CDLL(None, use_errno=True)
    roots = libc.shmget(0, 4096, 0o1000 | 0o600)
    assert roots >= 0
    try:
        assert shm in _ipc_ids("shm") and sem in _ipc_ids("sem") and msg in _ipc_ids("msg")
        removed = remove_leftovers(uid, folders=[tmp_path])
        assert {(o.kind, o.id) for o in removed.ipc} == {("shm", shm), ("sem", sem), ("msg", msg)}
        assert shm not in _ipc_ids("shm") and sem not in _ipc_ids("sem")
        assert msg not in _ipc_ids("msg")
        assert roots in _ipc_ids("shm")
    finally:
        libc.shmctl(roots, 0, None)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder every user may pass through (pytest's temp root is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="argosy-left-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


LEAVE = """\
import ctypes, os, sys
tag = sys.argv[1]
open(f"/dev/shm/{tag}", "wb").write(b"x" * (1 << 20))
os.mkdir(f"/tmp/{tag}")
open(f"/tmp/{tag}/f", "w").write("y")
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0, 4096, 0o1000 | 0o666), flush=True)
"""


@ROOT_ONLY
@pytest.mark.integration
@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_what_a_job_user_left_goes_when_its_last_attempt_ends(open_base: Path) -> None:
    """Through the local executor, as a queue's job user: while another attempt of that
    user runs, its files stay; once the last one has ended, the files it left in /dev/shm
    and /tmp and its 0666 segment are gone."""
    from argosy.executors.local import LocalExecutor, LocalOptions

    base = f"argosy-l{uuid.uuid4().hex[:6]}"
    identity = JobIdentity.from_settings(run_as=base, per_queue=True, allow_root=False)
    executor = LocalExecutor(LocalOptions(identity=identity))
    tag = f"argosy-left-{uuid.uuid4().hex[:8]}"
    try:
        user = identity.for_queue("qa")
        assert user is not None
        leave = _request(open_base, "jleave", (sys.executable, "-c", LEAVE, tag))
        stay = _request(open_base, "jstay", ("sleep", "60"))
        executor.start(stay)
        executor.start(leave)
        _wait_exits(executor, {"jleave"})
        assert Path(f"/dev/shm/{tag}").exists(), "removed while the user still ran an attempt"
        shm = int((leave.run_dir / "server" / "attempt1" / "output.log").read_text().split()[0])
        assert shm in _ipc_ids("shm")
        executor.stop("jstay")  # SIGTERM to its command
        _wait_exits(executor, {"jstay"})
        assert not Path(f"/dev/shm/{tag}").exists() and not Path(f"/tmp/{tag}").exists()
        assert shm not in _ipc_ids("shm")
    finally:
        executor.close()
        for path in (Path(f"/dev/shm/{tag}"), Path(f"/tmp/{tag}")):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(True)
        for name in (f"{base}-qa",):
            subprocess.run(["userdel", name], capture_output=True)
            subprocess.run(["groupdel", name], capture_output=True)


def _request(base: Path, job_id: str, command: tuple[str, ...]) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        attempt=1,
        script="",
        args=(),
        nproc_per_node=1,
        run_dir=base / "runs" / job_id,
        nodes={"h": 1},
        chip="cpu",
        command=command,
        queue="qa",
    )


def _wait_exits(executor: object, want: set[str], timeout_s: float = 60) -> None:
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= seen:
        assert time.monotonic() < deadline, f"no exit of {want - seen}"
        seen |= {e.job_id for e in executor.poll()}  # type: ignore[attr-defined]
        time.sleep(0.05)
