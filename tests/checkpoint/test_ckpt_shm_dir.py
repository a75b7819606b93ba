"""Slots live in this user's own folder: job ids are public, and in a shared /dev/shm
another user could create a job's slot names first, failing every save and restart of it
on files it does not own. Nobody else can create names in a folder of ours (mode 0700)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from argosy.checkpoint import segment
from argosy.checkpoint.segment import private_dir


def _private(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def test_the_slot_folder_is_this_user_s_and_closed_to_others() -> None:
    assert segment.SHM_DIR.name == f"argosy-{os.geteuid()}" or segment.SHM_DIR.name.startswith(
        f"argosy-{os.geteuid()}-"
    )
    assert _private(segment.SHM_DIR)


def test_the_folder_is_made_private_and_an_open_one_of_ours_is_closed(tmp_path: Path) -> None:
    made = private_dir(tmp_path)
    assert made == tmp_path / f"argosy-{os.geteuid()}" and _private(made)
    made.chmod(0o777)
    assert private_dir(tmp_path) == made and _private(made)


@pytest.mark.parametrize("planted", ["link", "folder of another user", "file"])
def test_a_name_another_user_holds_gives_a_fresh_private_folder(
    tmp_path, monkeypatch, planted
) -> None:
    me = os.geteuid()
    target = tmp_path / "theirs"
    target.mkdir(mode=0o777)
    if planted == "folder of another user":  # we play a user whose name a folder of ours holds
        me += 1
        monkeypatch.setattr(segment.os, "geteuid", lambda: me)
    name = tmp_path / f"argosy-{me}"
    if planted == "link":
        name.symlink_to(target)
    elif planted == "file":
        name.write_bytes(b"")
    else:
        name.mkdir(mode=0o777)
    with pytest.warns(UserWarning, match="restore from disk"):
        fresh = private_dir(tmp_path)
    monkeypatch.undo()
    assert fresh.parent == tmp_path and fresh.name.startswith(f"argosy-{me}-")
    assert _private(fresh)
    assert not any(target.iterdir())  # nothing went through the link
