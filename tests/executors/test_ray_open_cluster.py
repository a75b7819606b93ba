"""A Ray cluster that lets clients in without Ray's token is refused to a root server
whose jobs run as per-queue users, whatever mode the server's own client is in: the
cluster itself is asked, with one GCS call that carries no token."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_helpers import TOKEN_AUTH, RayCluster

from argosy.core.errors import ArgosyError
from argosy.executors.ray_address import asks_for_token


@pytest.fixture(scope="module")
def open_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A head started without token authentication; this process does not connect."""
    head = RayCluster(tmp_path_factory.mktemp("open-ray"), token=False, head_only=True)
    yield head
    head.stop()


def test_an_open_cluster_answers_the_tokenless_probe(open_head: RayCluster) -> None:
    assert asks_for_token(open_head.address) is False


def test_the_probe_cannot_tell_where_no_gcs_answers(open_head: RayCluster) -> None:
    """A port where something else listens (the head's own dashboard agent is not a GCS;
    a plain HTTP/1 listener answers no gRPC) is neither open nor closed: an error."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(ArgosyError, match="cannot tell whether the Ray cluster"):
            asks_for_token(address, timeout_s=1.0)


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as per-queue users only under root")
def test_a_server_in_token_mode_is_refused_an_open_cluster(open_head: RayCluster) -> None:
    """The server's client carries a token (RAY_AUTH_MODE=token): Ray lets it into the
    open cluster all the same, and so would it let in any job. The server exits 2."""
    root = Path(tempfile.mkdtemp(prefix="argosy-open-ray-", dir="/tmp"))
    os.chmod(root, 0o711)  # job users pass through to the run directories
    cmd = [sys.executable, "-m", "argosy", "server", "--executor", "ray"]
    cmd += ["--home", str(root / "home"), "--ray-address", open_head.address, "--port", "0"]
    env = dict(os.environ) | TOKEN_AUTH
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "lets any client in without a token" in done.stderr
    assert "Traceback" not in done.stderr
    shutil.rmtree(root)
