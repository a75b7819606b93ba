"""`argosy serve` refuses what it cannot serve with one `error:` line and exit 2, never a
traceback: a `draft:PATH` without a checkpoint (before anything loads, so the server
never reports ready and then rejects every request), a device this host lacks, and a
model directory the engine cannot load."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from argosy.cli.serve import _load_failure
from argosy.core.errors import ArgosyError
from argosy.serving.config import EngineConfig
from argosy.serving.errors import EngineFailedError
from argosy.serving.placement import visible_cuda_count
from argosy.serving.speculative import check_spec

SERVE = [sys.executable, "-m", "argosy", "serve", "--threads", "1", "--host", "127.0.0.1"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, "--port", str(_free_port()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_a_missing_draft_checkpoint_is_refused_before_loading(tmp_path: Path) -> None:
    start = time.monotonic()
    line = _one_error_line(_serve("--speculative", f"draft:{tmp_path / 'nowhere'}"))
    assert f"draft checkpoint not found: {tmp_path / 'nowhere'} has no config.json" in line
    assert time.monotonic() - start < 60  # nothing was loaded first


@pytest.mark.parametrize(
    ("spec", "want"),
    [("draft", "needs a checkpoint: draft:PATH"), ("self:x", "whole number of layers")],
)
def test_a_method_without_its_argument_is_refused(spec: str, want: str) -> None:
    with pytest.raises(ArgosyError, match=want):
        check_spec(spec)


def test_a_draft_directory_with_a_config_passes_the_check(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    check_spec(f"draft:{tmp_path}")
    check_spec("self:2")
    check_spec("off")


@pytest.mark.skipif(visible_cuda_count() > 0, reason="this host has a CUDA device")
def test_a_cuda_device_this_host_lacks_is_one_line_and_exit_2() -> None:
    line = _one_error_line(_serve("--speculative", "off", "--device", "cuda"))
    assert "device 'cuda:0' is not on this host" in line and "use auto or cpu" in line


def test_a_load_failure_becomes_one_line() -> None:
    config = EngineConfig(model="/models/empty")
    err = _load_failure(config, EngineFailedError("OSError: Couldn't load:\n(1) a\n(2) b"))
    assert isinstance(err, ArgosyError)
    assert str(err) == "cannot serve /models/empty: OSError: Couldn't load: (1) a (2) b"
    placement = _load_failure(config, EngineFailedError("PlacementError: device 'cuda:0' x"))
    assert str(placement) == "cannot serve /models/empty: device 'cuda:0' x"
    interrupt = KeyboardInterrupt()
    assert _load_failure(config, interrupt) is interrupt
