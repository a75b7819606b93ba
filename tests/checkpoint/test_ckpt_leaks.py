"""Nothing of a checkpointer is left in the temp dir: socket directories go on every path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from argosy.checkpoint import FlashCheckpointer
from argosy.checkpoint.launch import SOCKET_PREFIX, reap_socket_dirs

MAKE_DIR = (
    "import os, sys, tempfile, time\n"
    "d = tempfile.mkdtemp(prefix=f'argosy-ckpt-{os.getpid()}-', dir=sys.argv[1])\n"
    "print(d, flush=True)\n"
    "time.sleep(60)\n"
)


def test_the_socket_directory_goes_once_the_persister_connected(tmp_path, job, ck):
    with FlashCheckpointer(tmp_path / "ckpt", job_id=job) as ckpt:
        ckpt.save(1, ck.small_state())
        ckpt.wait()
        sockdir = Path(ckpt._launch.sockdir)
        assert sockdir.name.startswith(f"{SOCKET_PREFIX}{os.getpid()}-")
        assert not sockdir.exists()  # connected: the socket file is not needed any more
    assert not sockdir.exists()


def test_directories_of_dead_owners_are_reaped_and_live_ones_kept(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", MAKE_DIR, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    dead_dir = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)  # SIGKILLed before its persister connected
    child.wait()
    child.stdout.close()
    live_dir = tmp_path / f"{SOCKET_PREFIX}{os.getpid()}-abc"
    live_dir.mkdir()
    old_unowned = tmp_path / f"{SOCKET_PREFIX}x1y2z3"  # the naming before owners were recorded
    old_unowned.mkdir()
    an_hour_ago = time.time() - 7200
    os.utime(old_unowned, (an_hour_ago, an_hour_ago))
    fresh_unowned = tmp_path / f"{SOCKET_PREFIX}q9r8s7"
    fresh_unowned.mkdir()
    unrelated = tmp_path / "argosy-bench-1"
    unrelated.mkdir()

    removed = set(reap_socket_dirs(str(tmp_path)))

    assert removed == {dead_dir, old_unowned}
    assert live_dir.exists() and fresh_unowned.exists() and unrelated.exists()
