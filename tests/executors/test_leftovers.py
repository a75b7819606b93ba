"""What a job user leaves besides processes (files in /dev/shm and /tmp, SysV IPC objects)
goes once it has been idle on the machine for a grace period, removed by a process of that
user: never another user's, never through a link, never while a process of it runs, never
for an account the server did not make, and never on the server's loop. The parsing and
the timing run everywhere; owning files as other users and running as them needs root."""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from launch_requests import command_request

from argosy.executors.isolation import (
    JOB_IDS,
    JOB_USER_COMMENT,
    JobIdentity,
    JobUser,
    ensure_user,
    id_taken,
    planned_id,
)
from argosy.executors.leftovers import (
    BUSY,
    REFUSED,
    IpcObject,
    LeftoverRemoval,
    cleanable,
    ipc_objects_of,
    owned_entries,
    parse_sysvipc,
    processes_of,
)
from argosy.executors.limits import JobLimitsConfig

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="files and IPC of other users need root")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removals (`python -m argosy.executors.leftovers` as a job user, from /) import this
    checkout's argosy, whatever the test run's (relative) PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))


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


def _account(uid: int, comment: str | None) -> Callable[[int], pwd.struct_passwd]:
    """A lookup that knows one account, `uid` with `comment` (None: none at all)."""

    def lookup(number: int) -> pwd.struct_passwd:
        if comment is None or number != uid:
            raise KeyError(number)
        return pwd.struct_passwd(("u", "x", uid, uid, comment, "/nonexistent", "/bin/false"))

    return lookup


@pytest.mark.parametrize(
    ("uid", "comment", "want"),
    [
        (0, JOB_USER_COMMENT, False),
        (1000, JOB_USER_COMMENT, False),
        (65534, JOB_USER_COMMENT, False),
        (JOB_IDS.start - 1, JOB_USER_COMMENT, False),
        (JOB_IDS.start, JOB_USER_COMMENT, True),
        (20031, JOB_USER_COMMENT, True),
        (JOB_IDS.stop - 1, JOB_USER_COMMENT, True),
        (JOB_IDS.stop, JOB_USER_COMMENT, False),
        (25000, "Alice Example", False),
        (25000, "", False),
        (25000, None, False),
    ],
    ids=[
        "root",
        "person-range",
        "nobody",
        "below",
        "first",
        "job",
        "last",
        "past",
        "directory-account-in-range",
        "made-before-the-comment",
        "no-account",
    ],
)
def test_only_job_users_the_server_created_are_cleaned(
    uid: int, comment: str | None, want: bool
) -> None:
    assert cleanable(uid, _account(uid, comment)) == want


STATUS = "Name:\tx\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{}\t{}\t{}\t{}\nGid:\t1\t1\t1\t1\n"


def test_a_process_counts_for_its_real_effective_or_saved_uid(tmp_path: Path) -> None:
    for pid, uids in {
        "11": (20031, 0, 0, 0),  # real
        "12": (0, 20031, 0, 0),  # effective
        "13": (0, 0, 20031, 0),  # saved
        "14": (0, 0, 0, 20031),  # file system uid alone: not its process
        "15": (20032, 20032, 20032, 20032),  # another user's
        "16": (20031, 20031, 20031, 20031),  # the removal itself
    }.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "status").write_text(STATUS.format(*uids))
    (tmp_path / "self").mkdir()
    (tmp_path / "17").mkdir()  # gone while listed: no status
    assert sorted(processes_of(20031, tmp_path, but={16})) == [11, 12, 13]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_user_is_due_after_the_grace_period_since_its_last_attempt_and_never_while_busy() -> None:
    clock = FakeClock()
    removal = LeftoverRemoval(grace_s=60, clock=clock, is_cleanable=lambda uid: uid != 20099)
    removal.ended(20031)
    removal.ended(None)  # the server's own user: never
    removal.ended(20099)  # not a job user the server made: never
    clock.now_s += 59.9
    assert removal.due(busy=set()) == []
    clock.now_s += 0.1
    assert removal.due(busy={20031}) == []  # an attempt of it runs again
    assert removal.due(busy={None, 20032}) == [20031]
    removal.ended(20031)  # a later attempt of it ended: the grace period starts again
    assert removal.due(busy=set()) == []
    removal.started(20031)  # and another one starts: nothing of it is due any more
    clock.now_s += 600
    assert removal.due(busy=set()) == []


class Scripted(LeftoverRemoval):
    """A removal that runs `script` (as this user) instead of the real one."""

    def __init__(self, script: str, clock: FakeClock) -> None:
        super().__init__(grace_s=60, deadline_s=300, clock=clock, is_cleanable=lambda uid: True)
        self.script = script

    def command(self, uid: int) -> list[str]:
        return [sys.executable, "-c", self.script]


def _reap_until(removal: LeftoverRemoval, done: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the removal did not end"
        removal.reap()
        time.sleep(0.02)


def test_a_busy_user_is_tried_again_after_another_grace_period() -> None:
    clock = FakeClock()
    removal = Scripted(f"import sys; print('{{}}'); sys.exit({BUSY})", clock)
    removal.ended(20031)
    clock.now_s += 60
    removal.start(20031)
    assert removal.removing == {20031} and removal.due(busy=()) == []
    _reap_until(removal, lambda: not removal.removing)
    assert removal.due(busy=()) == []
    clock.now_s += 60
    assert removal.due(busy=()) == [20031]


def test_a_removal_past_its_deadline_is_killed_and_one_of_a_starting_user_at_once() -> None:
    clock = FakeClock()
    removal = Scripted("import time; time.sleep(60)", clock)
    removal.start(20031)
    removal.start(20032)
    (slow,) = [r.proc for uid, r in removal._removing.items() if uid == 20031]  # noqa: SLF001
    removal.reap()
    assert removal.removing == {20031, 20032}
    clock.now_s += 300
    removal.reap()  # killed now, reaped at a later poll
    _reap_until(removal, lambda: 20031 not in removal.removing)
    assert slow.returncode == -9
    removal.started(20032)  # an attempt of its user starts: killed before it does
    assert removal.removing == frozenset()
    assert removal.due(busy=()) == []


# As root: real job users, real removals.


def _shared(base: Path, name: str) -> Path:
    """A stand-in for /tmp or /dev/shm: sticky, writable by all."""
    folder = base / name
    folder.mkdir()
    os.chmod(folder, 0o1777)
    return folder


@pytest.fixture
def job_user() -> Iterator[JobUser]:
    """A job user as the server makes it (with its comment), removed after."""
    name = f"argosy-left-{uuid.uuid4().hex[:8]}"
    user = ensure_user(name)
    yield user
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", name], capture_output=True)


def _as(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def _remove_now(uid: int, folders: list[Path], sysvipc: Path = Path("/proc/sysvipc")) -> int:
    """Run one removal for `uid` to its end, as the server does; its exit status."""
    removal = LeftoverRemoval(grace_s=0, folders=folders, sysvipc=sysvipc)
    removal.ended(uid)
    assert removal.due(busy=()) == [uid]
    removal.start(uid)
    proc = removal._removing[uid].proc  # noqa: SLF001  # the removal under test
    _reap_until(removal, lambda: not removal.removing)
    assert proc.returncode is not None
    return proc.returncode


@ROOT_ONLY
def test_a_user_is_made_with_the_comment_that_makes_it_cleanable(job_user: JobUser) -> None:
    assert pwd.getpwuid(job_user.uid).pw_gecos == JOB_USER_COMMENT
    assert cleanable(job_user.uid)


@ROOT_ONLY
def test_a_user_s_top_level_entries_go_and_nothing_else(open_base: Path, job_user: JobUser) -> None:
    """Its files, folders (with all they hold) and links go; a link's target, another
    user's entries and entries below another user's folder stay."""
    uid, other = job_user.uid, job_user.uid + 1
    shared = _shared(open_base, "shm")
    keep = open_base / "keep"
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
    assert _remove_now(uid, [shared], sysvipc=open_base / "none") == 0
    assert sorted(p.name for p in shared.iterdir()) == ["other", "roots"]
    assert target.read_text() == "root's" and sorted(p.name for p in keep.iterdir()) == [
        "root-file"
    ]
    assert (roots / "under-root").exists()


@ROOT_ONLY
def test_another_user_s_files_in_a_folder_the_job_user_made_stay(
    open_base: Path, job_user: JobUser
) -> None:
    """The review's squat: the job user makes a well-known folder 0777 (`ray`), another
    user keeps a 0700 tree in it; the removal runs with the job user's rights, which
    cannot reach into that tree (root's rmtree removed it all)."""
    tmp = _shared(open_base, "tmp")
    squat = tmp / "ray"
    subprocess.run([*_as(job_user.uid), "mkdir", "-m", "777", str(squat)], check=True)
    victim = job_user.uid + 1
    make = f"mkdir -m 700 {squat}/session_v && mkdir {squat}/session_v/keep"
    make += f" && echo ckpt > {squat}/session_v/keep/ckpt"
    subprocess.run([*_as(victim), "sh", "-c", make], check=True)
    (squat / "ray_current_cluster").write_text("root")  # root's file in the job's folder

    _remove_now(job_user.uid, [tmp], sysvipc=open_base / "none")

    assert (squat / "session_v" / "keep" / "ckpt").read_text() == "ckpt\n"
    assert not (squat / "ray_current_cluster").exists()  # the job user could remove it too


@ROOT_ONLY
def test_nothing_goes_while_a_process_of_the_user_runs(open_base: Path, job_user: JobUser) -> None:
    """A process of the uid (a second server's job, an escaped daemon): the removal exits
    BUSY and the files stay; once it has ended, they go."""
    tmp = _shared(open_base, "tmp")
    subprocess.run([*_as(job_user.uid), "touch", str(tmp / "left")], check=True)
    daemon = subprocess.Popen([*_as(job_user.uid), "sleep", "60"])
    try:
        time.sleep(0.1)  # (past setpriv)
        assert _remove_now(job_user.uid, [tmp], sysvipc=open_base / "none") == BUSY
        assert (tmp / "left").exists()
    finally:
        daemon.kill()
        daemon.wait()
    assert _remove_now(job_user.uid, [tmp], sysvipc=open_base / "none") == 0
    assert not (tmp / "left").exists()


@ROOT_ONLY
def test_an_account_the_server_did_not_make_is_never_cleaned(open_base: Path) -> None:
    """A uid in the job range without the comment (a directory-service account, a job
    user of an earlier release): the server never schedules it, and the removal itself,
    run as it, refuses; as root, too."""
    tmp = _shared(open_base, "tmp")
    stranger = planned_id(f"argosy-left-{uuid.uuid4().hex[:8]}", id_taken)
    subprocess.run([*_as(stranger), "touch", str(tmp / "theirs")], check=True)
    removal = LeftoverRemoval(grace_s=0, folders=[tmp])
    removal.ended(stranger)
    assert removal.due(busy=()) == []
    module = [sys.executable, "-m", "argosy.executors.leftovers", "--folder", str(tmp)]
    for who in (_as(stranger), []):
        done = subprocess.run([*who, *module], capture_output=True, cwd="/")
        assert done.returncode == REFUSED, done
    (tmp / "roots").write_text("root's")
    assert sorted(p.name for p in tmp.iterdir()) == ["roots", "theirs"]


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
def test_a_user_s_sysv_objects_are_removed(open_base: Path, job_user: JobUser) -> None:
    """A segment (mode 0666, as in the finding), a semaphore set and a message queue made
    by a job user go; root's own segment stays."""
    made = subprocess.run(
        [*_as(job_user.uid), sys.executable, "-c", MAKE_IPC],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    shm, sem, msg = map(int, made)
    libc = ctypes.CDLL(None, use_errno=True)
    roots = libc.shmget(0, 4096, 0o1000 | 0o600)
    assert roots >= 0
    try:
        assert shm in _ipc_ids("shm") and sem in _ipc_ids("sem") and msg in _ipc_ids("msg")
        assert _remove_now(job_user.uid, [open_base]) == 0
        assert shm not in _ipc_ids("shm") and sem not in _ipc_ids("sem")
        assert msg not in _ipc_ids("msg")
        assert roots in _ipc_ids("shm")
    finally:
        libc.shmctl(roots, 0, None)


SHARED_SHM = JobLimitsConfig(private_shm=False)
"""Attempts in the host's /dev/shm and SysV IPC (`private_shm` off): what they leave there
is this module's subject."""
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
def test_what_a_job_user_left_goes_once_it_is_idle(open_base: Path) -> None:
    """Through the local executor, as a queue's job user: while another attempt of that
    user runs, its files stay; once the last one has ended (a grace period of 0 here), the
    files it left in /dev/shm and /tmp and its 0666 segment are gone."""
    from argosy.executors.local import LocalExecutor, LocalOptions

    base = f"argosy-l{uuid.uuid4().hex[:6]}"
    identity = JobIdentity.from_settings(run_as=base, per_queue=True, allow_root=False)
    removal = LeftoverRemoval(grace_s=0)
    executor = LocalExecutor(LocalOptions(identity=identity, limits=SHARED_SHM), leftovers=removal)
    tag = f"argosy-left-{uuid.uuid4().hex[:8]}"
    try:
        leave = command_request(open_base, "jleave", (sys.executable, "-c", LEAVE, tag), queue="qa")
        stay = command_request(open_base, "jstay", ("sleep", "60"), queue="qa")
        executor.start(stay)
        executor.start(leave)
        _wait_exits(executor, {"jleave"})
        assert not removal.removing
        assert Path(f"/dev/shm/{tag}").exists(), "removed while the user still ran an attempt"
        shm = int((leave.run_dir / "server" / "attempt1" / "output.log").read_text().split()[0])
        assert shm in _ipc_ids("shm")
        executor.stop("jstay")  # SIGTERM to its command
        _wait_exits(executor, {"jstay"})
        _poll_until(executor, lambda: not Path(f"/dev/shm/{tag}").exists() and not removal.removing)
        assert not Path(f"/tmp/{tag}").exists()
        assert shm not in _ipc_ids("shm")
    finally:
        executor.close()
        for path in (Path(f"/dev/shm/{tag}"), Path(f"/tmp/{tag}")):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(True)
        _delete_users(base, ("qa",))


DEEP_AND_MANY = """\
import os, sys
top = sys.argv[1]
os.mkdir(f"{top}/many")
for i in range(20000):
    os.close(os.open(f"{top}/many/{i}", os.O_CREAT | os.O_WRONLY))
os.mkdir(f"{top}/deep")
os.chdir(f"{top}/deep")
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
"""


@ROOT_ONLY
@pytest.mark.integration
def test_a_deep_tree_and_many_files_cost_no_exits(open_base: Path) -> None:
    """The review's lost exits: a job user leaves a folder 3,000 levels deep and 20,000
    files in a temp folder, and its attempt ends in the same poll as another tenant's.
    Both exits are reported (root's rmtree raised RecursionError out of `poll`, losing
    both), and the removal, a process of that user, removes all of it."""
    from argosy.executors.local import LocalExecutor, LocalOptions

    tmp = _shared(open_base, "tmp")
    base = f"argosy-l{uuid.uuid4().hex[:6]}"
    identity = JobIdentity.from_settings(run_as=base, per_queue=True, allow_root=False)
    removal = LeftoverRemoval(grace_s=0, folders=[tmp], sysvipc=open_base / "none")
    executor = LocalExecutor(LocalOptions(identity=identity, limits=SHARED_SHM), leftovers=removal)
    try:
        attacker = command_request(
            open_base, "jdeep", (sys.executable, "-c", DEEP_AND_MANY, str(tmp)), queue="qa"
        )
        other = command_request(open_base, "jother", ("true",), queue="qb")
        executor.start(other)
        executor.start(attacker)
        for job in ("jother", "jdeep"):  # both ended before the poll that reads them
            exit_code = attempt_exit_code(open_base / "runs" / job)
            assert exit_code == 0, f"{job} exited {exit_code}"
        started = time.monotonic()
        exits = executor.poll()
        assert time.monotonic() - started < 5.0  # the removal is not waited for
        assert {e.job_id for e in exits} == {"jother", "jdeep"}
        assert removal.removing  # under way, as the job user
        _poll_until(executor, lambda: not removal.removing)
        assert list(tmp.iterdir()) == []
    finally:
        executor.close()
        _delete_users(base, ("qa", "qb"))


@ROOT_ONLY
@pytest.mark.integration
def test_a_user_s_warm_process_ends_before_its_leftovers_go(open_base: Path) -> None:
    """The warm process kept for the queue's next attempt is a process of the job user
    (and could hold a /dev/shm segment): once the user is idle, it ends first (with its
    holding cgroup), and the removal, at a later poll, finds no process of the user."""
    from argosy.executors.local import LocalExecutor, LocalOptions

    tmp = _shared(open_base, "tmp")
    base = f"argosy-l{uuid.uuid4().hex[:6]}"
    identity = JobIdentity.from_settings(run_as=base, per_queue=True, allow_root=False)
    removal = LeftoverRemoval(grace_s=0, folders=[tmp], sysvipc=open_base / "none")
    executor = LocalExecutor(LocalOptions(identity=identity, warm=True), leftovers=removal)
    try:
        touch = command_request(open_base, "jtouch", ("touch", str(tmp / "left")), queue="qa")
        executor.start(touch)
        user = identity.for_queue("qa")
        assert user in executor._warm  # noqa: SLF001  # its warm process, under test
        _wait_exits(executor, {"jtouch"})
        _poll_until(executor, lambda: not (tmp / "left").exists())
        assert user not in executor._warm  # noqa: SLF001
        _poll_until(executor, lambda: not removal.removing)
    finally:
        executor.close()
        _delete_users(base, ("qa",))


def attempt_exit_code(run_dir: Path, timeout_s: float = 120) -> int:
    """The exit status the attempt's wrapper wrote, once it has."""
    path = run_dir / "server" / "attempt1" / "exit.code"
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{run_dir.name} did not end"
        time.sleep(0.05)
    time.sleep(0.1)  # (its wrapper exits right after)
    return int(path.read_text())


@ROOT_ONLY
def test_an_adopted_attempt_without_its_uid_file_counts_by_its_log_s_owner(
    tmp_path: Path,
) -> None:
    """An attempt of a release before `job.uid`, found ended after a restart: its user is
    the owner of its output log, and its leftovers are scheduled."""
    from argosy.executors.local import LocalExecutor, LocalOptions, attempt_dir

    clock = FakeClock()
    removal = LeftoverRemoval(grace_s=60, clock=clock, is_cleanable=lambda uid: True)
    executor = LocalExecutor(LocalOptions(), leftovers=removal)
    try:
        where = attempt_dir(tmp_path / "runs" / "jold", 1)
        where.mkdir(parents=True)
        (where / "exit.code").write_text("0")
        (where / "output.log").write_text("")
        os.chown(where / "output.log", 20031, 20031)
        assert executor.adopt("jold", 1, tmp_path / "runs" / "jold") is not None
        clock.now_s += 60
        assert removal.due(busy=()) == [20031]
    finally:
        executor.close()


def _delete_users(base: str, queues: tuple[str, ...]) -> None:
    for queue in queues:
        subprocess.run(["userdel", f"{base}-{queue}"], capture_output=True)
        subprocess.run(["groupdel", f"{base}-{queue}"], capture_output=True)


def _wait_exits(executor: object, want: set[str], timeout_s: float = 60) -> None:
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= seen:
        assert time.monotonic() < deadline, f"no exit of {want - seen}"
        seen |= {e.job_id for e in executor.poll()}  # type: ignore[attr-defined]  # an executor
        time.sleep(0.05)


def _poll_until(executor: object, done: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not done in time"
        executor.poll()  # type: ignore[attr-defined]  # an executor
        time.sleep(0.05)
