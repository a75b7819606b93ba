"""A persister whose trainer dies during the connection handshake acts as its orphan (it
persists what the trainer held and lets go) instead of exiting on a traceback."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading

from argosy.checkpoint.persister import PersisterSpec
from argosy.checkpoint.segment import SHM_DIR


def test_a_handshake_cut_short_leaves_an_orphan_not_a_crash(tmp_path, job, ck) -> None:
    address = str(tmp_path / "trainer.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(1)

    def die_during_handshake() -> None:  # accept, then vanish before the challenge
        conn, _ = listener.accept()
        conn.close()

    threading.Thread(target=die_during_handshake, daemon=True).start()
    spec = PersisterSpec(
        str(tmp_path / "ckpt"), job, 0, 1, 2, 2, 0.0, 30.0, 0.0, str(SHM_DIR), os.getpid(), 1
    )
    env = ck.env_with_repo() | {
        "ARGOSY_PERSISTER_KEY": os.urandom(16).hex(),
        "ARGOSY_PERSISTER_SPEC": json.dumps(dataclasses.asdict(spec)),
    }
    cmd = [sys.executable, "-m", "argosy.checkpoint.persister", address]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
