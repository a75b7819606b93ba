"""The progress board: what a rank writes in its process, the agent reads in another."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from argosy.runtime.board import (
    RING,
    ProgressBoard,
    Slot,
    injected_at,
    owner_of,
    reap_stale_boards,
    ring_entries,
)


def test_ring_keeps_the_newest_entries_in_order(tmp_path: Path) -> None:
    board = ProgressBoard.create(tmp_path / "b", world_size=2)
    row = board.row(1)
    for step in range(1, RING + 11):
        row.push_step(step, loss=1.0 / step, t_end=float(step), compute_s=0.01)
    entries, count = ring_entries(board.snapshot(), 1, since=0)
    assert count == RING + 10
    assert [e[0] for e in entries] == list(range(11, RING + 11))
    later, _ = ring_entries(board.snapshot(), 1, since=count - 3)
    assert [e[0] for e in later] == [RING + 8, RING + 9, RING + 10]
    assert ring_entries(board.snapshot(), 0, since=0) == ([], 0)
    board.unlink()


RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from argosy.runtime.hooks import attach
    rt = attach()
    rt.restored(3)
    for step in (4, 5):
        rt.step_begin(step)
        with rt.compute():
            sum(range(10000))
        with rt.collective():
            pass
        rt.step_end(step, step * 0.5)
    with rt.checkpointing(5):
        pass
    rt.finish()
    """
)


def test_a_rank_process_reports_through_shared_memory(tmp_path: Path) -> None:
    board = ProgressBoard.create(tmp_path / "board", world_size=2)
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "ARGOSY_BOARD": str(board.path),
        "ARGOSY_RUN_DIR": str(tmp_path),
        "ARGOSY_ATTEMPT": "2",
        "ARGOSY_INJECT": '{"0": {"kind": "slow", "rank": 1, "step": 5, "factor": 3.0}}',
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", RANK_SCRIPT], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    snap = board.snapshot()
    assert snap[0].sum() == 0  # rank 1 wrote only its own row
    assert snap[1, Slot.ATTEMPT] == 2 and snap[1, Slot.RESTORED_STEP] == 3
    assert snap[1, Slot.COLL_ENTERED] == 2 and snap[1, Slot.COLL_EXITED] == 2
    assert snap[1, Slot.CKPT_STEP] == 5 and snap[1, Slot.T_DONE] > 0
    entries, _ = ring_entries(snap, 1, since=0)
    assert [(s, loss) for s, loss, _, _ in entries] == [(4, 2.0), (5, 2.5)]
    assert injected_at(snap, 1, 0) > 0  # the slow injection fired at step 5
    assert "injected: slow rank 1" in done.stderr
    board.unlink()


def test_boards_of_dead_launchers_are_reaped_live_and_unknown_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        boards = {
            "dead": tmp_path / f"argosy-r1.{dead.pid}.board",
            "live": tmp_path / f"argosy-r2.{live.pid}.board",
            "unknown": tmp_path / "argosy-r3.board",  # no owner pid: cannot tell
        }
        for path in boards.values():
            ProgressBoard.create(path, world_size=1).close()
        removed = reap_stale_boards(tmp_path)
        assert removed == [boards["dead"]]
        assert {k for k, p in boards.items() if p.exists()} == {"live", "unknown"}
        assert owner_of(boards["live"]) == live.pid and owner_of(boards["unknown"]) is None
    finally:
        live.kill()
        live.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="boards of two users need root to make")
def test_another_users_stale_board_is_left_alone_not_an_error() -> None:
    """A job user's launcher reaps in the /dev/shm it shares with root and other tenants:
    a dead launcher's board of another user is theirs (the sticky bit forbids removing
    it), so it is skipped, and the launcher starts (it used to exit with EPERM)."""
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="argosy-shm-", dir="/tmp"))
    os.chmod(shared, 0o1777)  # what /dev/shm is
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    roots = shared / f"argosy-r1.{dead.pid}.board"
    ProgressBoard.create(roots, world_size=1).close()
    code = (
        "import sys; from pathlib import Path; from argosy.runtime.board import reap_stale_boards;"
        f"print(len(reap_stale_boards(Path({str(shared)!r}))))"
    )
    try:
        done = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                sys.executable,
                "-c",
                code,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "0" and roots.exists()
    finally:
        roots.unlink(missing_ok=True)
        shared.rmdir()


def test_a_board_name_another_user_took_or_linked_is_refused(tmp_path, monkeypatch) -> None:
    """Board names in /dev/shm are guessable (run id and pid): a planted file or link
    under one must be neither read as this run's board nor written through."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 4096)
    link = tmp_path / "argosy-run.1.board"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        ProgressBoard.create(link, 2)
    assert victim.read_bytes() == b"x" * 4096
    mine = tmp_path / "argosy-run.2.board"
    ProgressBoard.create(mine, 2).close()
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as another user
    with pytest.raises(PermissionError, match="not a file of this user"):
        ProgressBoard.attach(mine)
    with pytest.raises(PermissionError):
        ProgressBoard.create(mine, 2)


def test_the_slots_of_a_run_whose_launcher_died_are_freed_at_the_next_launch(
    tmp_path: Path,
) -> None:
    """A launcher killed with SIGKILL (its node lost) leaves its flash-checkpoint slots in
    /dev/shm; the next launch of the same user frees those of runs with no live board,
    and never a live run's or a slot not named by a launcher run."""
    import subprocess
    import sys

    from argosy.checkpoint.segment import PREFIX, SHM_DIR, stale_run_segments
    from argosy.runtime.board import live_runs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tag = f"{os.getpid() % 10**6:06d}"
        runs = {"dead": f"999990-{tag}", "live": f"999991-{tag}", "boardless": f"999992-{tag}"}
        ProgressBoard.create(tmp_path / f"argosy-{runs['dead']}.{dead.pid}.board", 1).close()
        ProgressBoard.create(tmp_path / f"argosy-{runs['live']}.{live.pid}.board", 1).close()
        slots = {k: SHM_DIR / f"{PREFIX}{run}-r0-s1" for k, run in runs.items()}
        slots["script"] = SHM_DIR / f"{PREFIX}0123456789ab-r0-s1"  # a checkpointer's own
        for path in slots.values():
            path.write_bytes(b"x")
        assert live_runs(tmp_path) == {runs["live"]}
        stale = set(stale_run_segments(live_runs(tmp_path)))
        assert {slots["dead"], slots["boardless"]} <= stale
        assert slots["live"] not in stale and slots["script"] not in stale
    finally:
        live.kill()
        for path in slots.values():
            path.unlink(missing_ok=True)
