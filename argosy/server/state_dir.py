"""The server's state on disk and who may read it.

Everything the server writes is its own: `argosy server` runs under umask 077, and its
home, database, tokens and logs are 0700/0600 whoever starts it. When jobs run as other
users (`run_as`), they must still reach their run directories, so the home and `runs/`
become 0711 (enter, not list) and
each run directory is the job's group's (`argosy.executors.isolation.prepare_run_dir`).
At start the server proves that the job user can run the Python it launches jobs with
and reach `runs/`; a setup where it cannot fails at start, naming the path and the fix.

    identity = job_identity(config)
    secure_home(config, identity)      # before the store opens
    secure_files(config)               # after: the database and its WAL files 0600
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

from argosy.core.errors import ArgosyError
from argosy.executors.isolation import PROBE, JobIdentity, JobUser, JobUsers
from argosy.server.config import ServerConfig

FALLBACK_RUNS = Path("/var/lib/argosy/runs")
log = logging.getLogger("argosy.server")
PRIVATE_FILES = ("argosy.db", "argosy.db-wal", "argosy.db-shm", "admin.token")


def fallback_runs(home: Path) -> Path:
    """Where a root server whose job users cannot reach `<home>/runs` keeps run dirs."""
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    return FALLBACK_RUNS.parent / f"{FALLBACK_RUNS.name}-{digest}"


def run_dir_of(home: Path, job_id: str) -> Path:
    """A job's run directory as a server on `home` placed it (for tools beside the
    server, such as `argosy demo`, that read it as root)."""
    default = home / "runs" / job_id
    fallback = fallback_runs(home) / job_id
    return fallback if not default.exists() and fallback.exists() else default


def job_users(config: ServerConfig) -> JobUsers:
    """The job-user settings, as each machine that runs jobs applies them."""
    return JobUsers(config.run_as, config.run_as_per_queue, config.allow_root_jobs)


def job_identity(config: ServerConfig) -> JobIdentity | None:
    """Which user jobs run as, as this machine sees it (the local and ray executors;
    a Ray node applies the same settings by its own rights); None for other executors."""
    if config.executor not in ("local", "ray"):
        return None
    return job_users(config).here()


def secure_home(config: ServerConfig, identity: JobIdentity | None) -> ServerConfig:
    """The home and `runs/` modes: 0711 where job users must pass, else 0700. Returns
    the config with the run directories where job users can reach them."""
    shared = identity is not None and identity.active
    mode = 0o711 if shared else 0o700
    for path in (config.home, config.runs_dir):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
    local = config.executor == "local"  # Ray's nodes mount runs/ itself: no local fallback
    if shared and local and config.runs_root is None and not PROBE.may_enter(config.runs_dir):
        runs = fallback_runs(config.home)
        for path in (FALLBACK_RUNS.parent, runs):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, mode)
        log.warning("job users cannot reach %s; run directories are in %s", config.home, runs)
        config = config.model_copy(update={"runs_root": runs})
    return config


def secure_files(config: ServerConfig) -> None:
    """The database (with its WAL files) and the admin token: 0600."""
    for name in PRIVATE_FILES:
        path = config.home / name
        if path.exists():
            os.chmod(path, 0o600)


def check_job_user(config: ServerConfig, identity: JobIdentity | None) -> None:
    """Fail now, naming the path and the fix, when jobs could not start: their users
    could not run this Python, reach the run directories, or be created."""
    if identity is None or not identity.active:
        return
    if identity.per_queue and shutil.which("useradd") is None:
        raise ArgosyError(
            "jobs run as one user per queue, created on demand, but useradd is missing:"
            " install it (passwd), or set run_as to an existing user and"
            " run_as_per_queue: false"
        )
    user = identity.representative()
    assert user is not None
    python = Path(sys.executable)
    if not (user.may_read(python) and user.may_enter(python)):  # enter: the execute bit
        raise ArgosyError(_unreachable(user, python, "run the Python that launches jobs"))
    if not user.may_enter(config.runs_dir):
        raise ArgosyError(_unreachable(user, config.runs_dir, "reach its run directory"))


def _unreachable(user: JobUser, path: Path, what: str) -> str:
    blocker = _first_closed(user, path)
    return (
        f"jobs run as user '{user.name}', who cannot {what}: {path}"
        + (f" ({blocker} is mode {oct(blocker.stat().st_mode & 0o777)})" if blocker else "")
        + "; put the server's home (--home) and the Python environment where others may"
        " enter (e.g. /var/lib/argosy, /opt), or set allow_root_jobs: true to run jobs as"
        " root without isolation"
    )


def _first_closed(user: JobUser, path: Path) -> Path | None:
    real = Path(os.path.realpath(path))
    for p in [*reversed(real.parents), real]:
        if not user.may_enter(p) and p != real:
            return p
    return None
