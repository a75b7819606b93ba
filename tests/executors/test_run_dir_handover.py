"""A job submitted before 16-digit user names keeps its run directory: the old user's
tree is handed to the queue's new user at the next attempt, by descriptor, never through
a link, and nothing another user owns changes. Re-owning needs root; the naming does not."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.executors.isolation import (
    JobUser,
    legacy_user_name_for,
    prepare_run_dir,
    user_name_for,
)
from argosy.executors.run_dir_handover import hand_over

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="re-owning files needs root")
OLD, NEW, OTHER = (23460, 23461), (23462, 23463), (23464, 23465)


def test_former_names_are_known_where_they_differ() -> None:
    assert legacy_user_name_for("argosy-job", "team-a") is None  # plain: never changed
    assert legacy_user_name_for("argosy-job", None) is None
    old = legacy_user_name_for("argosy-job", "Team-A")
    assert old is not None and len(old.rsplit("-", 1)[1]) == 8
    assert user_name_for("argosy-job", "Team-A") != old
    shaped = "5ee609b6a1b2c3d4"  # a digest-shaped queue: kept as it was, hashed now
    assert legacy_user_name_for("argosy-job", shaped) == f"argosy-job-{shaped}"


@given(queue=st.text(min_size=1, max_size=40))
def test_a_former_name_is_never_today_s(queue: str) -> None:
    old = legacy_user_name_for("argosy-job", queue)
    assert old != user_name_for("argosy-job", queue)


Tree = list[tuple[str, str, str]]  # (relative path, kind, owner)
OWNERS = {"old": OLD, "other": OTHER, "root": (0, 0)}


def _build(top: Path, tree: Tree, outside: Path) -> None:
    for rel, kind, owner in tree:
        path = top / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            path.mkdir(exist_ok=True)
        elif kind == "file":
            path.write_text("x")
        else:
            path.symlink_to(outside)
        os.chown(path, *OWNERS[owner], follow_symlinks=False)


trees = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "a/c", "a/d", "b/e/f", "g"]).map(lambda p: p + "_x"),
        st.sampled_from(["dir", "file", "link"]),
        st.sampled_from(sorted(OWNERS)),
    ),
    max_size=8,
    unique_by=lambda t: t[0],
)


@ROOT_ONLY
@settings(max_examples=30, deadline=None)
@given(tree=trees)
def test_what_the_old_user_owned_becomes_the_new_one_s_and_nothing_else_changes(
    tree: Tree, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.mktemp("handover")
    outside = base / "outside"
    outside.write_text("not theirs")
    os.chown(outside, *OLD)  # owned by the old user, outside the tree: never changed
    top = base / "run"
    top.mkdir()
    os.chown(top, 0, OLD[1])
    _build(top, tree, outside)
    before = {p: os.lstat(p) for p in top.rglob("*")}
    hand_over(top, OLD, NEW)
    assert os.lstat(top).st_gid == NEW[1] and os.lstat(top).st_uid == 0
    assert (os.lstat(outside).st_uid, os.lstat(outside).st_gid) == OLD
    for path, was in before.items():
        now = os.lstat(path)
        assert now.st_uid == (NEW[0] if was.st_uid == OLD[0] else was.st_uid)
        assert now.st_gid == (NEW[1] if was.st_gid == OLD[1] else was.st_gid)


@ROOT_ONLY
def test_a_job_s_run_directory_under_its_former_user_is_handed_over_at_its_next_start(
    tmp_path: Path,
) -> None:
    old, new = JobUser("argosy-t-old", *OLD), JobUser("argosy-t-new", *NEW)
    other = JobUser("argosy-t-other", *OTHER)
    run = tmp_path / "runs" / "j1"
    prepare_run_dir(run, old)  # what the older release made
    ckpt = run / "checkpoints" / "step_10"
    ckpt.mkdir(parents=True)
    (ckpt / "shard.bin").write_bytes(b"w")
    for path in (run / "checkpoints", ckpt, ckpt / "shard.bin"):
        os.chown(path, *OLD)
    with pytest.raises(Exception, match="another job's or planted"):
        prepare_run_dir(run, other, legacy=None)  # another queue's user: refused as before
    prepare_run_dir(run, new, legacy=old)
    info = os.lstat(run)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, NEW[1], 0o1770)
    assert (os.lstat(ckpt / "shard.bin").st_uid, os.lstat(ckpt / "shard.bin").st_gid) == NEW
    prepare_run_dir(run, new, legacy=old)  # once: the next start finds it the new one's
    assert os.lstat(run).st_gid == NEW[1]
    with pytest.raises(Exception, match="another job's or planted"):
        prepare_run_dir(run, other, legacy=old)  # only the former group is handed over


@ROOT_ONLY
def test_the_former_user_is_found_only_where_it_exists_and_is_not_today_s() -> None:
    import subprocess

    from argosy.executors.isolation import JobIdentity, ensure_user

    identity = JobIdentity("argosy-tl")
    name = legacy_user_name_for("argosy-tl", "Team-Z")
    assert name is not None
    assert identity.legacy_for("Team-Z") is None  # no such user here
    assert identity.legacy_for("team-z") is None  # a plain name never changed
    try:
        made = ensure_user(name)
        found = identity.legacy_for("Team-Z")
        assert found is not None and (found.name, found.uid, found.gid) == (
            made.name,
            made.uid,
            made.gid,
        )
        assert JobIdentity("argosy-tl", per_queue=False).legacy_for("Team-Z") is None
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)
