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


@pytest.fixture(scope="module")
def token_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A head that asks for the tests' token (`TOKEN_AUTH`); this process does not connect."""
    head = RayCluster(tmp_path_factory.mktemp("token-ray"), head_only=True)
    yield head
    head.stop()


def test_a_token_cluster_takes_its_token_and_refuses_another(token_head: RayCluster) -> None:
    from argosy.executors.ray_address import check_own_token

    assert asks_for_token(token_head.address) is True
    right = {"authorization": f"Bearer {TOKEN_AUTH['RAY_AUTH_TOKEN']}"}
    check_own_token(token_head.address, right)  # accepted: nothing raised
    with pytest.raises(ArgosyError, match="refuses this server's Ray token"):
        check_own_token(token_head.address, {"authorization": "Bearer " + "0" * 32})
    with pytest.raises(ArgosyError, match="this server has none"):
        check_own_token(token_head.address, {})


@pytest.mark.parametrize("token", [None, "0" * 32], ids=["no-token", "wrong-token"])
def test_a_server_without_the_cluster_s_token_exits_2_at_once(
    token_head: RayCluster, tmp_path: Path, token: str | None
) -> None:
    """Not the 20 s of Ray's client retrying, then a traceback and exit 3."""
    cmd = [sys.executable, "-m", "argosy", "server", "--executor", "ray", "--allow-root-jobs"]
    cmd += ["--home", str(tmp_path / "home"), "--ray-address", token_head.address]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token of this machine's user
    done = subprocess.run(
        cmd + ["--port", "0"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2, done.stderr[-2000:]
    want = "refuses this server's Ray token" if token else "this server has none"
    assert want in done.stderr and "Traceback" not in done.stderr


def test_a_ray_server_stops_cleanly_on_sigterm(token_head: RayCluster, tmp_path: Path) -> None:
    """`ray.init` installs Ray's own SIGTERM handler; the server keeps uvicorn's, so a
    stop (systemd's) shuts down in order and ends by the signal (a clean stop to systemd)
    or 0, not with exit status 15 and a traceback."""
    import signal
    import time
    import urllib.error
    import urllib.request

    from ray_helpers import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "argosy", "server", "--executor", "ray", "--allow-root-jobs"]
    cmd += ["--home", str(tmp_path / "home"), "--ray-address", token_head.address]
    cmd += ["--port", str(port)]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/nodes", timeout=2)
        except urllib.error.HTTPError:
            break  # answering (401 without a token): started
        except OSError:
            assert time.monotonic() < deadline, "the server never answered"
            time.sleep(0.2)
    server.send_signal(signal.SIGTERM)
    _, err = server.communicate(timeout=60)
    assert server.returncode in (0, -signal.SIGTERM), err[-3000:]  # uvicorn re-raises it
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
