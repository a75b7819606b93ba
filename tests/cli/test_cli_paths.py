"""Output paths that cannot be written are usage errors (exit 2, one line naming the
option), checked before the work starts, for every command that writes one."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import argosy

from argosy.cli.paths import writable_dir, writable_file
from argosy.core.errors import ArgosyError


@pytest.fixture
def blocker(tmp_path: Path) -> Path:
    path = tmp_path / "file"
    path.write_text("a file where a directory is wanted")
    return path


CASES = {
    "sim generate --out under a file": (
        ["sim", "generate", "--cluster", "h100:8", "--days", "0.1", "--out", "{blocker}/out"],
        "--out",
    ),
    "sim run --plot is a directory": (
        ["sim", "run", "--cluster", "h100:8", "--queues", "q.yaml", "--trace", "t.jsonl"]
        + ["--plot", "{tmp}"],
        "--plot",
    ),
    "launch --run-dir is a file": (
        ["launch", "--nproc-per-node", "1", "--run-dir", "{blocker}", "{blocker}"],
        "--run-dir",
    ),
    "server --home is a file": (["server", "--home", "{blocker}", "--port", "0"], "--home"),
    "demo --home under a file": (["demo", "--home", "{blocker}/home", "--port", "0"], "--home"),
}


@pytest.mark.parametrize(("args", "want"), list(CASES.values()), ids=list(CASES))
def test_unwritable_output_paths_exit_2_naming_the_option(
    tmp_path: Path, blocker: Path, args: list[str], want: str
) -> None:
    done = argosy(*[a.format(blocker=blocker, tmp=tmp_path) for a in args], columns=200)
    assert done.returncode == 2, done.stderr
    assert want in done.stderr and "Traceback" not in done.stderr


def test_checks_create_nothing_for_a_file_and_the_directory_for_a_dir(tmp_path: Path) -> None:
    writable_file(tmp_path / "a" / "b" / "plot.png", "--plot")
    assert not (tmp_path / "a").exists()
    assert writable_dir(tmp_path / "c" / "d", "--out").is_dir()
    assert list((tmp_path / "c" / "d").iterdir()) == []  # the probe file is gone


def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArgosyError, match="--out"):
        writable_dir(Path("/proc/argosy-out"), "--out")
    with pytest.raises(ArgosyError, match="--plot"):
        writable_file(Path("/proc/argosy.png"), "--plot")
