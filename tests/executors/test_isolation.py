"""What a job inherits and who it runs as: the environment allow-list, user names per
queue, and (under root) the permission model checked against the kernel's own answer."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argosy.core.errors import ArgosyError
from argosy.executors.isolation import (
    JOB_IDS,
    MAX_USER_NAME,
    SECRET_MARKERS,
    JobIdentity,
    JobUser,
    ensure_user,
    id_taken,
    job_environment,
    launch_environment,
    planned_id,
    prepare_run_dir,
    user_name_for,
)

FIXTURE_OK = HealthCheck.function_scoped_fixture

NAMES = st.one_of(
    st.sampled_from(
        [
            "PATH",
            "ARGOSY_HOME",
            "ARGOSY_TOKEN",
            "ARGOSY_ADMIN_TOKEN",
            "ARGOSY_SERVER",
            "AWS_SECRET_ACCESS_KEY",
            "HF_TOKEN",
            "OMP_NUM_THREADS",
            "NCCL_AUTH_KEY",
            "CUDA_VISIBLE_DEVICES",
            "DATABASE_PASSWORD",
            "LC_ALL",
            "HOME",
            "USER",
            "GITHUB_TOKEN",
            "ARGOSY__SERVER__ADMIN",
            "ARGOSY__RUNTIME__TERM_GRACE_S",
            "TORCH_API_KEY",
        ]
    ),
    st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True),
)
ENVS = st.dictionaries(NAMES, st.text(max_size=20), max_size=30)


@given(base=ENVS, extra=st.dictionaries(st.sampled_from(["ARGOSY_JOB_ID", "X"]), st.text()))
def test_the_job_environment_holds_no_secret_of_the_server(
    base: dict[str, str], extra: dict[str, str]
) -> None:
    env = job_environment(base, extra, home="/runs/j1")
    inherited = {k for k in env if k not in extra and k != "HOME"}
    for name in inherited:
        assert not SECRET_MARKERS.search(name), name
        assert env[name] == base[name] or name == "PATH"  # PATH: its absolute entries
    for name in ("ARGOSY_HOME", "ARGOSY_SERVER", "USER", "ARGOSY__SERVER__ADMIN"):
        assert name not in inherited
    assert env["HOME"] == "/runs/j1"
    for k, v in extra.items():
        assert env[k] == v


@pytest.mark.parametrize(
    ("path", "want"),
    [("/usr/bin:.:bin::/bin", "/usr/bin:/bin"), (":", ""), ("/opt/x/bin", "/opt/x/bin")],
)
def test_a_job_path_keeps_only_absolute_entries(path: str, want: str) -> None:
    """A relative PATH entry looks commands up in the current directory: the job's
    workdir, where the root wrapper that runs `mv` and `setpriv` starts."""
    assert job_environment({"PATH": path}, {})["PATH"] == want


def test_the_allow_list_passes_what_jobs_need() -> None:
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "2", "NCCL_DEBUG": "INFO", "LC_ALL": "C"}
    base |= {"SITE_DATA": "/data", "SITE_TOKEN": "x"}
    env = job_environment(base, {}, allow=["SITE_*"])
    assert {k: env[k] for k in base if k in env} == {
        k: v for k, v in base.items() if k != "SITE_TOKEN"
    }


@given(queue=st.text(min_size=1, max_size=100))
def test_user_names_are_valid_and_one_per_queue(queue: str) -> None:
    name = user_name_for("argosy-job", queue)
    assert len(name) <= MAX_USER_NAME
    assert re.fullmatch(r"[a-z_][a-z0-9_-]*", name), name
    assert user_name_for("argosy-job", queue) == name


@given(a=st.text(min_size=1, max_size=40), b=st.text(min_size=1, max_size=40))
def test_different_queues_get_different_users(a: str, b: str) -> None:
    if a != b:
        assert user_name_for("argosy-job", a) != user_name_for("argosy-job", b)


@given(
    base=st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True),
    queue=st.one_of(st.text(min_size=1, max_size=40), st.from_regex(r"[a-z0-9-]{1,40}")),
)
def test_a_queue_named_like_another_s_digest_gets_a_user_of_its_own(base: str, queue: str) -> None:
    """`Team-A` runs as `argosy-job-<digest>`: a queue named `<digest>` (or any tail of
    the hashed name) must not run as that same user."""
    name = user_name_for(base, queue)
    for cut in range(1, len(name)):
        other = name[cut:]
        if other != queue:
            assert user_name_for(base, other) != name, (queue, other)


def test_a_non_root_server_runs_jobs_as_itself() -> None:
    identity = JobIdentity.from_settings(run_as=None, per_queue=True, allow_root=False)
    if os.geteuid() != 0:
        assert not identity.active and identity.for_queue("a") is None
    else:
        assert identity.active


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@ROOT_ONLY
def test_root_needs_allow_root_jobs_to_run_jobs_as_root() -> None:
    assert not JobIdentity.from_settings(run_as=None, per_queue=True, allow_root=True).active
    with pytest.raises(Exception, match="allow_root_jobs"):
        JobIdentity.from_settings(run_as="root", per_queue=True, allow_root=False)


MODES = st.integers(min_value=0, max_value=0o777)


@pytest.fixture(scope="module")
def open_base() -> Iterator[Path]:
    """A directory every user may pass through (pytest's own temp root is 0700)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="argosy-perm-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@ROOT_ONLY
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(dir_mode=MODES, file_mode=MODES, group_owned=st.booleans())
def test_may_read_agrees_with_the_kernel(
    open_base: Path, dir_mode: int, file_mode: int, group_owned: bool
) -> None:
    """`JobUser.may_read` (mode-bit math) answers what the kernel answers for that user."""
    user = JobUser("nobody", 65534, 65534)
    folder = open_base / uuid.uuid4().hex
    folder.mkdir()
    path = folder / "f"
    path.write_text("x")
    if group_owned:
        os.chown(folder, 0, user.gid)
        os.chown(path, 0, user.gid)
    os.chmod(path, file_mode)
    os.chmod(folder, dir_mode)
    kernel = subprocess.run([*user.setpriv(), "test", "-r", str(path)]).returncode == 0
    assert user.may_read(path) == kernel


@given(
    name=NAMES.map(lambda q: user_name_for("argosy-job", q)),
    taken=st.sets(st.integers(JOB_IDS.start, JOB_IDS.stop - 1), max_size=64),
)
def test_a_created_user_s_id_is_its_name_s_wherever_that_id_is_free(
    name: str, taken: set[int]
) -> None:
    """Every node picks the same uid for a job user while it is free there (a run
    directory on shared storage is the same user's on each node); a taken one is
    stepped over, never handed out twice."""
    free = planned_id(name, lambda n: False)
    got = planned_id(name, taken.__contains__)
    assert got in JOB_IDS and got not in taken
    if free not in taken:
        assert got == free
    else:  # the next free one after it, wrapping around the range
        span = len(JOB_IDS)
        steps = (got - free) % span
        assert all((free - JOB_IDS.start + k) % span + JOB_IDS.start in taken for k in range(steps))


@ROOT_ONLY
def test_a_created_job_user_has_its_planned_uid_and_gid() -> None:
    import pwd

    name = f"argosy-t-{uuid.uuid4().hex[:8]}"
    try:
        user = ensure_user(name)
        want = planned_id(name, lambda n: n != user.uid and id_taken(n))
        assert (user.uid, user.gid) == (want, want), (user, want)
        assert pwd.getpwnam(name).pw_shell in ("/usr/sbin/nologin", "/bin/false")
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


@ROOT_ONLY
def test_a_node_makes_a_job_user_with_the_server_s_ids_or_refuses() -> None:
    """On a Ray node the job user gets the server's uid and gid; a node where the name
    has other ids, or the ids are another user's, refuses instead of mixing tenants."""
    import pwd

    name, other = f"argosy-t-{uuid.uuid4().hex[:8]}", f"argosy-t-{uuid.uuid4().hex[:8]}"
    free = planned_id(name, id_taken)
    try:
        assert ensure_user(name, ids=(free, free)) == JobUser(name, free, free)
        assert pwd.getpwnam(name).pw_uid == free
        with pytest.raises(ArgosyError, match="on the server's"):
            ensure_user(name, ids=(free + 1, free + 1))  # the name is another uid here
        with pytest.raises(ArgosyError, match="another user or group"):
            ensure_user(other, ids=(free, free))  # the server's uid is another user's here
        with pytest.raises(KeyError):
            pwd.getpwnam(other)  # nothing was made
    finally:
        for who in (name, other):
            subprocess.run(["userdel", who], capture_output=True)
            subprocess.run(["groupdel", who], capture_output=True)


@ROOT_ONLY
def test_a_run_directory_of_another_job_group_is_refused_not_re_owned(tmp_path: Path) -> None:
    """A run directory is made root's with the job's group, and kept so on every later
    attempt; one that is another group's, a user's, or a link is refused as it is."""
    import stat

    user, other = JobUser("argosy-t-a", 23456, 23457), JobUser("argosy-t-b", 23458, 23459)
    run = tmp_path / "runs" / "j1"
    for _ in range(2):  # the first attempt makes it, the next finds it as it left it
        prepare_run_dir(run, user)
        info = os.lstat(run)
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, user.gid, 0o1770)
    with pytest.raises(ArgosyError, match="another job's or planted"):
        prepare_run_dir(run, other)
    assert os.lstat(run).st_gid == user.gid  # left as it was
    planted = tmp_path / "runs" / "j2"
    planted.mkdir()
    os.chown(planted, user.uid, user.gid)  # a job user's own directory
    with pytest.raises(ArgosyError, match="uid 23456"):
        prepare_run_dir(planted, user)
    (tmp_path / "runs" / "j3").symlink_to(run)
    with pytest.raises(ArgosyError, match="link or file"):
        prepare_run_dir(tmp_path / "runs" / "j3", user)


def test_jobs_of_the_servers_own_user_share_its_model_cache(tmp_path: Path) -> None:
    """A replica's HOME is its run directory; its converted model (0.5 GB for smollm2)
    goes to the server's cache, once, not into every run directory."""
    env = launch_environment({"PATH": "/bin"}, {}, tmp_path / "run", None)
    assert env["HOME"] == str(tmp_path / "run")
    assert env["ARGOSY_CACHE_DIR"] == str(Path.home() / ".cache" / "argosy")
    told = launch_environment({"ARGOSY_CACHE_DIR": "/srv/cache"}, {}, tmp_path / "run", None)
    assert told["ARGOSY_CACHE_DIR"] == "/srv/cache"
