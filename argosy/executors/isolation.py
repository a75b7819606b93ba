"""What a job may reach on the machine it runs on: its environment and its user.

Two rules, applied by every executor before a job's first instruction runs:

1. **Environment: an allow-list.** A job sees the names below (paths, locale, threading
   and vendor runtime knobs), what the server sets for it (`ARGOSY_JOB_ID`, ...) and the
   names an operator adds (`job_env_allow`); never `ARGOSY_HOME`, a token, or anything
   whose name says it is a secret. `HOME` is the job's run directory.
2. **User: never root by accident.** When the server runs as root, jobs run as an
   unprivileged user (`run_as`, default `argosy-job`; with `run_as_per_queue` one user
   per queue, `argosy-job-<queue>`, so tenants cannot read each other's files or
   `/proc/<pid>/environ` either). Missing users are created (`useradd --system`). Running
   jobs as root needs `allow_root_jobs`. A server that is not root runs jobs as itself:
   then the job *can* read what that user can read (the admin token included); the docs
   say so, and production servers run as root with `run_as`. On Ray each node applies
   the server's settings (`JobUsers`) by its own rights: a root actor switches users.
   Created users get the same uid and gid on every machine (`planned_id`), so a run
   directory on storage several nodes mount is the same user's on each.

The user switch is `setpriv --reuid --regid --clear-groups --no-new-privs` in front of the
job's command (util-linux), so the wrapper around it (which records pids and exit codes
in a directory only the server can write) keeps running as the server.

    identity = JobIdentity.from_settings(run_as="argosy-job", per_queue=True, allow_root=False)
    user = identity.for_queue("team-a")        # JobUser(name='argosy-job-team-a', ...) or None
    env = job_environment(os.environ, {"ARGOSY_JOB_ID": "j1"}, home="/runs/j1")
"""

from __future__ import annotations

import fnmatch
import grp
import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from argosy.core.errors import ArgosyError
from argosy.executors.run_dir_handover import hand_over
from argosy.executors.timed_jobs import deny_timed_jobs

ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "ARGOSY_SHM_DIR",
        "ARGOSY_CACHE_DIR",
        "ARGOSY_DEVICE_LEDGER_DIR",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
    }
)
"""Names a job inherits from the server's environment."""
ALLOWED_PATTERNS = (
    "LC_*",
    "OMP_*",
    "KMP_*",
    "MKL_*",
    "OPENBLAS_*",
    "CUDA_*",
    "NCCL_*",
    "NVIDIA_*",
    "HIP_*",
    "ROCR_*",
    "HSA_*",
    "ASCEND_*",
    "ZE_*",
    "GLOO_*",
    "TORCH_*",
    "ARGOSY_EMULATE_*",
    "ARGOSY__RUNTIME__*",
    "ARGOSY__CHECKPOINT__*",
)
"""Patterns of names a job inherits: threading and vendor runtime knobs, argosy's own
runtime and checkpoint settings."""
SECRET_MARKERS = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|AUTH", re.I)
"""A name that says it holds a secret is never passed on, whatever allows it."""
DEFAULT_USER = "argosy-job"
MAX_USER_NAME = 32
DIGEST_CHARS = 16
DIGEST_SHAPE = re.compile(f"[0-9a-f]{{{DIGEST_CHARS}}}")
"""A queue's name hashed into its user's: what no plain queue name may look like."""
JOB_IDS = range(20000, 60000)
"""Where created job users' uids and gids lie: above the usual people's, below systemd's
dynamic users (61184), inside a 65,536-id user namespace."""
JOB_USER_COMMENT = "argosy job user"
"""The comment (gecos) of every account `ensure_user` creates: what tells a job user the
server made from an account that existed before, whatever its uid."""


def job_environment(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    *,
    home: str | None = None,
    allow: Iterable[str] = (),
    user: JobUser | None = None,
) -> dict[str, str]:
    """The environment of a job: the allowed part of `base`, then `extra` (what the
    server sets), then `HOME` (and `USER`/`LOGNAME` when it runs as `user`)."""
    patterns = (*ALLOWED_PATTERNS, *allow)
    env = {
        k: v
        for k, v in base.items()
        if (k in ALLOWED_NAMES or any(fnmatch.fnmatchcase(k, p) for p in patterns))
        and not SECRET_MARKERS.search(k)
    }
    env.update(extra)
    if "PATH" in env:  # a relative entry would look commands up in the job's workdir: the
        env["PATH"] = absolute_path_entries(env["PATH"])  # root wrapper's mv, setpriv
    if home is not None:
        env["HOME"] = home
    if user is not None:
        env["USER"] = env["LOGNAME"] = user.name
    return env


ENTER_AS_USER = 'cd -- "$1" || exit 126; shift; exec "$@"'
"""The shell that enters the workdir as the job's own user, then runs the job."""


def as_job_user(
    user: JobUser | None, command: list[str], workdir: str | None
) -> tuple[list[str], str | None]:
    """(argv, cwd) that run `command` from `workdir` as `user` (None: as this process,
    cwd `workdir`). The user enters the workdir itself, after `setpriv`, from `/`: a
    root process never changes into a path the job controls. A workdir the job replaced
    by a link after submit would otherwise take it, as root's cwd, past another
    tenant's 1770 run directory into what lies below."""
    if user is None:
        return list(command), workdir or None
    enter = ["sh", "-c", ENTER_AS_USER, "argosy-workdir", workdir] if workdir else []
    return [*user.setpriv(), *enter, *command], "/"


def absolute_path_entries(path: str) -> str:
    """`path` (a PATH value) less its empty and relative entries ("", ".", "bin"): with
    those, a command is looked up in the current directory, the tenant's workdir."""
    return os.pathsep.join(p for p in path.split(os.pathsep) if os.path.isabs(p))


@dataclass(frozen=True)
class JobUser:
    """The unprivileged account a job runs as (no supplementary groups)."""

    name: str
    uid: int
    gid: int

    def setpriv(self) -> list[str]:
        """The command prefix that runs what follows as this user, unable to regain
        privileges (setuid binaries included)."""
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]

    def may_read(self, path: str | Path) -> bool:
        """Whether this user can reach and read `path` (mode bits; ACLs ignored)."""
        return _may(self, Path(path), stat.S_IRUSR)

    def may_enter(self, path: str | Path) -> bool:
        """Whether this user can reach `path` and enter it (a directory)."""
        return _may(self, Path(path), stat.S_IXUSR)


def _may(user: JobUser, path: Path, want_owner_bit: int) -> bool:
    """Every ancestor searchable and `path` itself granting `want_owner_bit` (scaled to
    the group or other bits as the owner relation says)."""
    try:
        path = Path(os.path.realpath(path))
        chain = [*reversed(path.parents), path]
        for i, p in enumerate(chain):
            bit = want_owner_bit if i == len(chain) - 1 else stat.S_IXUSR
            if not _grants(os.stat(p), user, bit):
                return False
    except OSError:
        return False
    return True


def _grants(info: os.stat_result, user: JobUser, owner_bit: int) -> bool:
    if user.uid == 0:
        return True
    if info.st_uid == user.uid:
        return bool(info.st_mode & owner_bit)
    if info.st_gid == user.gid:
        return bool(info.st_mode & (owner_bit >> 3))
    return bool(info.st_mode & (owner_bit >> 6))


PROBE = JobUser("argosy-job", uid=2**31 - 2, gid=2**31 - 2)
"""A user that owns no file and is in no file's group, as a new job user is: what it may
reach, every per-queue job user may."""


def user_name_for(base: str, queue: str | None) -> str:
    """`base`, or `base-<queue>` when the queue's name is made of the characters a user
    name allows and fits; any other name (too long, other characters, or itself the
    shape of a digest) ends in a 64-bit hash of the queue instead. Two queues never share
    a user: a queue named `5ee609b6...` does not get the user of `Team-A`."""
    if queue is None:
        return base
    name = f"{base}-{queue}"
    plain = re.fullmatch(r"[a-z0-9_-]+", queue) and not DIGEST_SHAPE.fullmatch(queue)
    if plain and len(name) <= MAX_USER_NAME:
        return name
    digest = hashlib.sha256(queue.encode()).hexdigest()[:DIGEST_CHARS]
    return f"{base[: MAX_USER_NAME - DIGEST_CHARS - 1]}-{digest}"


def legacy_user_name_for(base: str, queue: str | None) -> str | None:
    """The name `user_name_for` gave the queue's user up to `d3f3cf7` (8-digit hashes,
    digest-shaped queue names kept), where it differs from today's; else None."""
    if queue is None:
        return None
    clean = re.sub(r"[^a-z0-9_-]", "-", queue.lower())
    old = f"{base}-{clean}"
    if len(old) > MAX_USER_NAME or clean != queue:
        old = f"{base[: MAX_USER_NAME - 9]}-{hashlib.sha256(queue.encode()).hexdigest()[:8]}"
    return None if old == user_name_for(base, queue) else old


def ensure_user(name: str, *, create: bool = True, ids: tuple[int, int] | None = None) -> JobUser:
    """The account `name`; created as a system user with its own group and no login
    shell when missing and `create` (ArgosyError when it cannot be had). With `ids`
    (uid, gid: the server's numbers for it, on a Ray node) it must have exactly those,
    and is made with them: a node where they differ would hand one tenant's files on
    the shared storage to another."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if not create:
            raise ArgosyError(f"no user '{name}' on this machine (run_as)") from None
        _create_user(name, ids)
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ArgosyError(f"run_as user '{name}' is root; set allow_root_jobs to mean that")
    if ids is not None and (entry.pw_uid, entry.pw_gid) != ids:
        raise ArgosyError(
            f"job user '{name}' is uid {entry.pw_uid}, gid {entry.pw_gid} on this node but"
            f" {ids[0]}, {ids[1]} on the server's: give job users the same ids on every node"
            " (a directory service), or remove it here and argosy makes it with the server's"
        )
    if os.geteuid() == 0:
        deny_timed_jobs(name)  # nothing it leaves with cron or at runs after its job
    return JobUser(name, entry.pw_uid, entry.pw_gid)


def planned_id(name: str, taken: Callable[[int], bool]) -> int:
    """The uid (and gid) a created job user gets: a hash of its name in `JOB_IDS`, the
    next free one on a collision. Every machine that creates the user picks the same
    number while the same numbers are free there, so a run directory on storage that
    several nodes mount is the same user's on each of them."""
    start, span = JOB_IDS.start, len(JOB_IDS)
    first = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % span
    for k in range(span):
        candidate = start + (first + k) % span
        if not taken(candidate):
            return candidate
    raise ArgosyError(f"no free uid in {JOB_IDS.start}-{JOB_IDS.stop - 1} for user '{name}'")


def id_taken(number: int) -> bool:
    """Whether a user or a group on this machine has the id `number`."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(number)
        except KeyError:
            continue
        return True
    return False


def _create_user(name: str, ids: tuple[int, int] | None = None) -> None:
    """Make `name` with `ids` (uid, gid), else with its planned id for both, its comment
    `JOB_USER_COMMENT` (the server made it: `leftovers.cleanable`)."""
    if ids is None:
        number = planned_id(name, id_taken)
        ids = (number, number)
    elif _is_another_s(ids, name):
        raise ArgosyError(
            f"cannot make job user '{name}' with uid {ids[0]} and gid {ids[1]} (the server's)"
            " on this node: another user or group has one of them here; give job users the"
            " same ids on every node (a directory service)"
        )
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    groupadd = shutil.which("groupadd") or "/usr/sbin/groupadd"
    command = [useradd, "--system", "--uid", str(ids[0]), "--gid", name, "--no-create-home"]
    command += ["--comment", JOB_USER_COMMENT]
    command += ["--no-log-init", "--home-dir", "/nonexistent", "--shell", shell, name]
    try:  # the group first, with its number (it may exist already: then it is used)
        group = [groupadd, "--system", "--gid", str(ids[1]), name]
        subprocess.run(group, capture_output=True, timeout=30)
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ArgosyError(f"cannot create run_as user '{name}': {err}") from err
    if done.returncode != 0 and not _exists(name):  # a concurrent useradd may have won
        raise ArgosyError(f"cannot create run_as user '{name}': {done.stderr.strip()}")


def _is_another_s(ids: tuple[int, int], name: str) -> bool:
    """Whether the uid is a user's here, or the gid a group's not called `name`."""
    try:
        pwd.getpwuid(ids[0])
        return True
    except KeyError:
        pass
    try:
        return grp.getgrgid(ids[1]).gr_name != name
    except KeyError:
        return False


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@dataclass(frozen=True)
class JobUsers:
    """The server's settings for job users, for each machine to apply by its own rights:
    a Ray node's actor runs jobs as the queue's user when it is root, whatever the
    server's own user (`JobIdentity.from_settings` on that node)."""

    run_as: str | None = None
    per_queue: bool = True
    allow_root: bool = False

    def here(self) -> JobIdentity:
        """Which user each queue's jobs run as on this machine."""
        return JobIdentity.from_settings(
            run_as=self.run_as, per_queue=self.per_queue, allow_root=self.allow_root
        )


@dataclass
class JobIdentity:
    """Which user a job of each queue runs as on this machine (None: the server's own)."""

    base: str | None
    per_queue: bool = True
    _users: dict[str | None, JobUser] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, *, run_as: str | None, per_queue: bool, allow_root: bool) -> JobIdentity:
        """Jobs run as `run_as` (or `argosy-job`) when this process is root, unless
        `allow_root`; a non-root server runs them as itself."""
        if os.geteuid() != 0:
            return cls(None, per_queue)
        if allow_root and run_as in (None, "root"):
            return cls(None, per_queue)
        if run_as == "root":
            raise ArgosyError("run_as root needs allow_root_jobs: true")
        return cls(run_as or DEFAULT_USER, per_queue)

    @property
    def active(self) -> bool:
        return self.base is not None

    def for_queue(self, queue: str | None, ids: tuple[int, int] | None = None) -> JobUser | None:
        """The queue's job user (made when missing); with `ids`, the one with exactly
        that uid and gid (`ensure_user`)."""
        if self.base is None:
            return None
        key = queue if self.per_queue else None
        found = self._users.get(key)
        if found is None:
            name = user_name_for(self.base, key)
            other = next((q for q, u in self._users.items() if u.name == name), key)
            if other != key:  # a 64-bit hash collision, or a bug: never share a user
                raise ArgosyError(f"queues '{other}' and '{key}' would both run as '{name}'")
            found = ensure_user(name, ids=ids)
            self._users[key] = found
        return found

    def names(self, name: str) -> bool:
        """Whether `name` is a user name this identity's base gives a queue
        (`user_name_for`)."""
        if self.base is None:
            return False
        cut = self.base[: MAX_USER_NAME - DIGEST_CHARS - 1]
        return name == self.base or name.startswith((f"{self.base}-", f"{cut}-"))

    def legacy_for(self, queue: str | None) -> JobUser | None:
        """The queue's user under the names of releases up to `d3f3cf7`, where that user
        exists here and is not today's (its run directories are handed over), else None."""
        if self.base is None or not self.per_queue:
            return None
        name = legacy_user_name_for(self.base, queue)
        try:
            entry = pwd.getpwnam(name) if name else None
        except KeyError:
            return None
        if entry is None or entry.pw_uid == 0:
            return None
        return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid)

    def representative(self) -> JobUser | None:
        """A user whose reach is every job user's: per queue, `PROBE` (job users own
        nothing outside their run directories, as `PROBE` owns nothing); else the one
        named user. None: jobs run as this process's own user."""
        if self.base is None:
            return None
        return PROBE if self.per_queue else self.for_queue(None)

    def may_reach(self, path: str | Path) -> bool:
        """Whether jobs may read `path` (a directory: enter it); this process's own
        access when they run as its user."""
        user = self.representative()
        if user is None:
            return os.access(path, os.R_OK)
        return user.may_enter(path) if os.path.isdir(path) else user.may_read(path)


def prepare_run_dir(run_dir: Path, user: JobUser | None, legacy: JobUser | None = None) -> None:
    """Create `run_dir` for a job. With a user: its parent passable (0711), the
    directory owned by root, group the user's, mode 1770 (sticky: the job creates and
    replaces its own files, but cannot rename or remove `server/`, the attempt records
    the server keeps there). A directory already there must be root's, its group root's
    or the user's: one of another job group (or a link, or a user's) is refused, never
    re-owned, as a node sharing the run directories could otherwise hand one tenant's
    files to another. The one exception is `legacy`, the same queue's user under older
    names (`JobIdentity.legacy_for`): its directory is handed over, tree and all."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    parent = run_dir.parent  # `runs/` (0711 already), or a service's `runs/<id>/`
    if parent.stat().st_uid == os.geteuid() and not parent.stat().st_mode & stat.S_IXOTH:
        os.chmod(parent, 0o711)  # made under umask 077: the replica's user must pass
    try:  # checked and changed through one descriptor: never through a link
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        info = os.lstat(run_dir)
        raise ArgosyError(
            f"run directory {run_dir} is a link or file of uid {info.st_uid}, gid"
            f" {info.st_gid}: planted; not handed over"
        ) from None
    try:
        info = os.fstat(fd)
        if legacy is not None and info.st_uid == 0 and info.st_gid == legacy.gid != user.gid:
            hand_over(run_dir, (legacy.uid, legacy.gid), (user.uid, user.gid))
            info = os.fstat(fd)
        if info.st_uid != 0 or info.st_gid not in (0, user.gid):
            raise ArgosyError(
                f"run directory {run_dir} is a directory of uid {info.st_uid}, gid"
                f" {info.st_gid}, not root's with group {user.name}: another job's or"
                " planted; not handed over"
            )
        if info.st_gid != user.gid:  # made just now (or by a server whose jobs ran as root)
            os.fchown(fd, 0, user.gid)
        os.fchmod(fd, 0o1770)
    finally:
        os.close(fd)


def attempt_records(where: Path, user: JobUser | None, log_name: str = "output.log") -> None:
    """The attempt's record directory, root's. Without a job user: 0700 (no job reads or
    plants anything there). With one: 0711, and `log_name` made and handed to that
    user, so a warm process that becomes the launcher as that user can open it (and no
    other name there)."""
    where.mkdir(parents=True, exist_ok=True)
    mode = 0o700 if user is None else 0o711
    for folder in (where.parent, where):
        os.chmod(folder, mode)
    if user is not None:
        fd = os.open(where / log_name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.fchown(fd, user.uid, user.gid)
        os.close(fd)


def launch_environment(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    run_dir: Path,
    user: JobUser | None,
    allow: Iterable[str] = (),
) -> dict[str, str]:
    """A job's whole environment on this machine: the allowed part of `base`, then
    `extra`, `HOME` its run directory; for a job user, its own cache and device ledger
    (converted models outlive a run: one cache per job user, made by root first); for
    the server's own user, the server's cache (a service's model is converted once, not
    into every replica's run directory: 0.5 GB each for smollm2)."""
    env = job_environment(base, extra, home=str(run_dir), allow=allow, user=user)
    if user is not None:
        env["ARGOSY_CACHE_DIR"] = cache = str(user_cache_dir(user))
        env["ARGOSY_DEVICE_LEDGER_DIR"] = f"{cache}/devices"  # no tenant can make it first
    else:  # the server's own user: its cache (`serving.models.cache_root`), not one per run
        env.setdefault("ARGOSY_CACHE_DIR", str(Path.home() / ".cache" / "argosy"))
    return env


CACHE_ROOT = Path("/var/cache/argosy")


def user_cache_dir(user: JobUser, root: Path = CACHE_ROOT) -> Path:
    """`root/<user>`: the job user's own cache (converted models), 0700, kept across
    runs so a queue's second service loads from it; no other tenant reads it."""
    path = root / user.name
    if not path.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        path.mkdir(exist_ok=True)
    info = path.lstat()
    if info.st_uid != user.uid or stat.S_IMODE(info.st_mode) != 0o700:
        os.chown(path, user.uid, user.gid)  # under root's 0711 folder: no job plants links
        os.chmod(path, 0o700)
    return path
