"""The device ledger's directory is each user's own: nobody can squat it and so fail every
other tenant's `--memory-fraction` service.

The old default was one shared name, `<tmp>/argosy-devices`; whoever made it first (another
tenant, or root in an earlier run) owned it, and every other user's service then failed
with "device ledger ... belongs to uid 0". Another user's files are played by reporting a
foreign owner from `os.lstat` for the names in question (the suite runs as any user)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from argosy.core.errors import ArgosyError
from argosy.core.procs import start_ticks
from argosy.executors import isolation
from argosy.executors.isolation import JobUser
from argosy.executors.local import LocalExecutor, LocalOptions
from argosy.serving import budget
from argosy.serving.budget import DeviceLedger, ledger_dir


@pytest.fixture(autouse=True)
def tmp_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temp directory is `tmp_path`; no runtime directory, no override, no cache."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("ARGOSY_DEVICE_LEDGER_DIR", raising=False)
    budget._private_ledger_dir.cache_clear()
    yield tmp_path
    budget._private_ledger_dir.cache_clear()


def held_by_another_user(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """`os.lstat` says another user owns `paths`."""
    real = os.lstat
    names = {os.fspath(p) for p in paths}

    def lstat(path, *args, **kw):
        st = real(path, *args, **kw)
        if os.fspath(path) in names:
            fields = list(st[:10])
            fields[stat.ST_UID] = os.geteuid() + 1
            return os.stat_result(fields)
        return st

    monkeypatch.setattr(os, "lstat", lstat)


def private(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def test_a_squatted_shared_name_fails_no_service(tmp_is: Path, monkeypatch) -> None:
    """The finding: `<tmp>/argosy-devices` made first by someone else (root) stops nobody."""
    squatted = tmp_is / "argosy-devices"
    squatted.mkdir(mode=0o700)
    held_by_another_user(monkeypatch, squatted)
    ledger = DeviceLedger("cpu")
    ledger.claim(0.5, "a")
    assert ledger.directory == tmp_is / f"argosy-devices-{os.geteuid()}"
    assert private(ledger.directory) and ledger.total() == pytest.approx(0.5)
    assert not any(squatted.iterdir())


@pytest.mark.parametrize("planted", ["directory of another user", "link", "file"])
def test_a_held_per_user_name_gives_a_fresh_private_directory(
    tmp_is: Path, monkeypatch, planted: str
) -> None:
    name = tmp_is / f"argosy-devices-{os.geteuid()}"
    target = tmp_is / "theirs"
    target.mkdir(mode=0o777)
    if planted == "link":
        name.symlink_to(target)
    elif planted == "file":
        name.write_bytes(b"")
    else:
        name.mkdir(mode=0o700)
        held_by_another_user(monkeypatch, name)
    with pytest.warns(UserWarning, match=f"{name} is held by"):
        chosen = ledger_dir()
    assert chosen.parent == tmp_is and chosen.name.startswith(f"{name.name}-")
    assert private(chosen)
    assert ledger_dir() == chosen  # one fresh directory per process, not one per call
    ledger = DeviceLedger("cpu")
    ledger.claim(0.4, "a")
    DeviceLedger("cpu").claim(0.4, "b")  # this process's services still sum up
    with pytest.raises(budget.ShareError, match="current sum is 0.8"):
        ledger.claim(0.3, "c")
    assert ledger.path.parent == chosen and not any(target.iterdir())


def test_the_runtime_directory_is_used_when_it_is_private(tmp_is: Path, monkeypatch) -> None:
    runtime = tmp_is / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert ledger_dir() == runtime / "argosy-devices" and private(runtime / "argosy-devices")
    budget._private_ledger_dir.cache_clear()
    runtime.chmod(0o755)  # open to others: not a runtime directory of this user's own
    assert ledger_dir() == tmp_is / f"argosy-devices-{os.geteuid()}"
    runtime.chmod(0o700)
    held_by_another_user(monkeypatch, runtime)  # e.g. root's, left in the environment
    assert ledger_dir() == tmp_is / f"argosy-devices-{os.geteuid()}"
    own = tmp_is / "mine"
    monkeypatch.setenv("ARGOSY_DEVICE_LEDGER_DIR", str(own))  # the override still wins
    assert ledger_dir() == own


def test_the_override_is_never_silently_replaced(tmp_is: Path, monkeypatch) -> None:
    """An operator's `ARGOSY_DEVICE_LEDGER_DIR` that is another user's is refused naming
    the variable (no quiet fallback), while the default under it is taken."""
    theirs = tmp_is / "theirs"
    theirs.mkdir(mode=0o700)
    held_by_another_user(monkeypatch, theirs, tmp_is / "argosy-devices")
    monkeypatch.setenv("ARGOSY_DEVICE_LEDGER_DIR", str(theirs))
    with pytest.raises(ArgosyError, match="ARGOSY_DEVICE_LEDGER_DIR"):
        DeviceLedger("cpu").claim(0.2, "a")
    monkeypatch.delenv("ARGOSY_DEVICE_LEDGER_DIR")
    DeviceLedger("cpu").claim(0.2, "a")  # the old shared name would have failed here


def test_a_claim_whose_pid_another_process_took_is_dropped(tmp_is: Path) -> None:
    """A ledger may outlive a reboot (a cache directory): a recorded pid that now names
    a process started at another time is not the claimant."""
    ledger = DeviceLedger("cpu", tmp_is / "ledger")
    ledger.claim(0.3, "live")
    records = json.loads(ledger.path.read_text())
    me = os.getpid()
    records["stale"] = {"fraction": 0.6, "pid": me, "start": start_ticks(me) - 1, "name": "x"}
    ledger.path.write_text(json.dumps(records))
    assert ledger.total() == pytest.approx(0.3)
    ledger.claim(0.7, "fits")  # the stale 0.6 no longer counts


def test_job_users_get_a_ledger_of_their_own(tmp_is: Path, monkeypatch) -> None:
    """The local executor (and a Ray node: `isolation.launch_environment`) points each
    job user at a ledger under its own cache directory
    (no tenant can create it first), whatever ledger the server itself was told to use."""
    monkeypatch.setattr(isolation, "user_cache_dir", lambda user: tmp_is / "cache" / user.name)
    monkeypatch.setenv("ARGOSY_DEVICE_LEDGER_DIR", "/srv/root-only-ledger")
    executor = LocalExecutor(LocalOptions())
    users = [JobUser("argosy-job-a", 2001, 2001), JobUser("argosy-job-b", 2002, 2002)]
    dirs = [executor.environment({}, tmp_is, u)["ARGOSY_DEVICE_LEDGER_DIR"] for u in users]
    assert dirs == [str(tmp_is / "cache" / u.name / "devices") for u in users]
    own = executor.environment({}, tmp_is, None)  # jobs of the server's own user
    assert own["ARGOSY_DEVICE_LEDGER_DIR"] == "/srv/root-only-ledger"
